"""The text pre-filter that lets files no codemod can change skip libcst (parse, metadata, print):
conservative — a file that reaches a legacy API through an alias, a star import, a relative import
or a re-export is still migrated exactly as without the filter — and files that do not parse are
still reported."""

from __future__ import annotations

import libcst as cst
import pytest

from codemods import migrate_code
from codemods._engine import pipeline

# (module the source lives in, source): each reaches a legacy API in a way that names it indirectly
INDIRECT = {
    "alias": (None, "import deepspeed.utils.groups as G\nx = G.get_data_parallel_group()\n"),
    "alias_from": (None, "from deepspeed.utils import groups as pg\nx = pg._get_expert_parallel_group('ep_size_2')\n"),
    "alias_function": (None, "from deepspeed.utils.groups import get_data_parallel_group as dp\nx = dp()\n"),
    "module_alias": (None, "import deepspeed as ds\nx = ds.utils.groups.get_tensor_model_parallel_group()\n"),
    "star": (None, "from deepspeed.utils.groups import *\nx = get_data_parallel_group()\n"),
    "star_then_name": (None, "from deepspeed.utils import *\nx = groups.get_data_parallel_world_size()\n"),
    "relative": ("deepspeed.runtime.x", "from ..utils import groups\nx = groups.get_data_parallel_group()\n"),
    "relative_dotted": (
        "deepspeed.runtime.zero.x",
        "from ...utils.groups import get_data_parallel_rank as r\nx = r()\n",
    ),
    "relative_package": ("deepspeed.moe.x", "from .. import utils\nx = utils.groups._get_data_parallel_group()\n"),
    "reexport_compat": (None, "from compat import groups\nx = groups.get_data_parallel_group()\n"),
    "grid_alias": (None, "from deepspeed.runtime.pipe import topology as T\ng = T.PipelineParallelGrid(topology=t)\n"),
    "initialize_alias": (None, "import deepspeed as d\ne, *_ = d.initialize(model=m, mpu=mpu, config=c)\n"),
    "inside_function": (
        None,
        "def f():\n    from deepspeed.utils import groups\n    return groups.get_data_parallel_group()\n",
    ),
    "comm_relative": ("deepspeed.runtime.x", "from .. import comm as dist\nr = dist.get_rank()\n"),
}


def package_of(module):
    return module.rpartition(".")[0] if module else None


def without_filter(monkeypatch, source, module, comm):
    """The migration with every pre-check disabled: every codemod runs on every file."""
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "_MARKERS", ("",))
        for codemod in (*pipeline.CODEMODS, pipeline.CommToTorchCommand):
            patch.setattr(codemod, "may_apply", classmethod(lambda cls, source, names=None: True))
        return migrate_code(source, module=module, package=package_of(module), comm_to_torch=comm)


@pytest.mark.parametrize("name", sorted(INDIRECT))
def test_indirect_legacy_uses_migrate_as_without_the_filter(monkeypatch, name):
    module, source = INDIRECT[name]
    comm = name.startswith("comm")
    ours = migrate_code(source, module=module, package=package_of(module), comm_to_torch=comm)
    full = without_filter(monkeypatch, source, module, comm)
    assert (ours.code, ours.sites, ours.todos) == (full.code, full.sites, full.todos)


def test_the_filter_really_skips_and_the_indirect_cases_are_handled():
    """The comparison above is not vacuous: most indirect uses are rewritten or flagged, and a
    file without a legacy name never reaches libcst."""
    handled = [
        n
        for n, (m, s) in INDIRECT.items()
        if (lambda r: r.code != s or r.todos)(
            migrate_code(s, module=m, package=package_of(m), comm_to_torch=n.startswith("comm"))
        )
    ]
    assert len(handled) >= len(INDIRECT) // 2, handled
    assert migrate_code("import os\nprint(os.getcwd())\n").skipped == "no legacy import"
    assert migrate_code("import deepspeed\nprint(deepspeed.__version__)\n").skipped == "no codemod applies"


def test_files_no_codemod_can_change_are_not_parsed_by_libcst(monkeypatch):
    def refuse(source, *args, **kwargs):
        raise AssertionError("libcst parsed a file no codemod can change")

    monkeypatch.setattr(pipeline.cst, "parse_module", refuse)
    for source in ("x = 1\n", "import deepspeed\nmodel = deepspeed.zero.Init()\n"):
        assert migrate_code(source).code == source


@pytest.mark.parametrize("source", ["def f(:\n    pass\n", "import deepspeed\nx = (\n"])
def test_a_file_that_does_not_parse_is_still_reported(source):
    with pytest.raises(cst.ParserSyntaxError):
        migrate_code(source)
