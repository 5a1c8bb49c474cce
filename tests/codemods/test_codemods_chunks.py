"""The piecewise migration of big files (codemods/_engine/chunks.py, pipeline._migrate_in_pieces) gives the
whole-file path's bytes, or is not taken: on generated files of the bench's shape, on every fixture
file with legacy sites, on real deepspeed files, and on files built to break each condition."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_codemods_metadata import deepspeed_file

from codemods._engine import chunks, pipeline
from codemods._engine.files import module_and_package

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from bench_big_file import HEADER, generate  # noqa: E402

FIXTURES = sorted(
    p
    for p in (ROOT / "tests" / "fixtures").rglob("*.py")
    if any(m in p.read_text(encoding="utf-8", errors="replace") for m in ("deepspeed", "groups", "topology", "compat"))
)


def whole(monkeypatch, source: str, **kwargs) -> pipeline.Migration:
    """The whole-file path (the piecewise one switched off)."""
    with monkeypatch.context() as patch:
        patch.setattr(chunks, "MIN_BYTES", 10**12)
        return pipeline.migrate_code(source, **kwargs)


def pieces(monkeypatch, source: str, group_bytes: int = 1, module=None, package=None):
    """The piecewise path on ``source`` whatever its size (groups of ``group_bytes``): None if not taken."""
    from codemods._engine.todo_links import collecting

    with monkeypatch.context() as patch, collecting():  # as migrate_code runs it (a site's comment text may
        patch.setattr(chunks, "GROUP_BYTES", group_bytes)  # depend on the comments written before it)
        return pipeline._migrate_in_pieces(source, None, module, package, pipeline.CODEMODS)


def same(a: pipeline.Migration, b: pipeline.Migration) -> bool:
    return (a.code, a.sites, a.todos) == (b.code, b.sites, b.todos)


@pytest.mark.parametrize(
    "every,group_bytes,taken",
    [
        (1, 4000, True),
        (50, chunks.GROUP_BYTES, True),
        (7, 3000, False),
        (1, 1, False),
    ],
)
def test_the_bench_shape_takes_the_piecewise_path_with_the_same_bytes(monkeypatch, every, group_bytes, taken):
    """Taken where every group the codemods change asks the same of the header (groups holding
    whole blocks); either way the bytes are the whole-file path's."""
    source = generate(0.012 if every == 1 else 0.04, every)
    fast = pieces(monkeypatch, source, group_bytes)
    expected = whole(monkeypatch, source)
    assert expected.code != source
    assert (fast is not None) if taken else True
    assert fast is None or same(fast, expected)


@pytest.mark.parametrize("trailer", ["", "\n\n# a trailing comment at column 0\n"])
def test_groups_with_sites_apart_are_migrated_together_with_the_same_bytes(monkeypatch, trailer):
    """Definitions holding sites with plain ones between them are parsed together (one module per
    ~GROUP_BYTES of them), the plain ones kept; the bytes are the whole-file path's."""
    source = generate(0.03, 5) + trailer
    expected = whole(monkeypatch, source)
    calls = []
    real = pipeline._transform
    monkeypatch.setattr(pipeline, "_transform", lambda *a: calls.append(a[0]) or real(*a))
    fast = pieces(monkeypatch, source, 4000)
    assert fast is not None and expected.code != source and same(fast, expected)
    runs = chunks.groups(chunks.plan(source), lambda unit: "groups" in unit.names)
    candidates = [g for g in runs if g.candidate]
    assert all(not b.candidate for a, b in zip(runs, runs[1:]) if a.candidate)  # they are apart
    assert 1 < len(calls) < len(candidates)  # fewer modules parsed than groups holding sites


def test_split_statements_gives_each_run_its_code_and_the_footer_to_the_last():
    import libcst as cst

    tree = cst.parse_module(
        "import x\n\n\ndef a():\n    pass\n\n# about b\ndef b():\n    pass\ndef c():\n    pass\n\n# end\n"
    )
    code = tree.code
    rest = code[len("import x\n") :]
    assert chunks.split_statements(tree, rest, [1, 2]) == [
        "\n\ndef a():\n    pass\n",
        "\n# about b\ndef b():\n    pass\ndef c():\n    pass\n\n# end\n",
    ]
    assert chunks.split_statements(tree, "something else", [1, 2]) is None


def test_migrate_code_takes_it_for_a_big_file(monkeypatch):
    source = generate(0.012, 1)
    taken = []
    real = pipeline._migrate_in_pieces
    monkeypatch.setattr(pipeline, "_migrate_in_pieces", lambda *a: taken.append(1) or real(*a))
    monkeypatch.setattr(chunks, "MIN_BYTES", 1000)
    monkeypatch.setattr(chunks, "GROUP_BYTES", 3000)
    assert same(pipeline.migrate_code(source), whole(monkeypatch, source)) and taken


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(ROOT / "tests" / "fixtures")))
def test_fixture_files_give_the_same_bytes_or_take_the_whole_file_path(monkeypatch, path):
    source = path.read_text(encoding="utf-8")
    module, package = module_and_package(path)
    for group_bytes in (1, 10**9):
        fast = pieces(monkeypatch, source, group_bytes, module, package)
        if fast is not None:
            assert same(fast, whole(monkeypatch, source, module=module, package=package))


@pytest.mark.deepspeed
@pytest.mark.parametrize("relative", ["moe/layer.py", "runtime/pipe/module.py", "sequence/layer.py", "moe/mappings.py"])
def test_deepspeed_files_give_the_same_bytes_or_take_the_whole_file_path(monkeypatch, relative):
    source = deepspeed_file(relative).read_text(encoding="utf-8")
    module = "deepspeed." + relative[: -len(".py")].replace("/", ".")
    package = module.rpartition(".")[0]
    fast = pieces(monkeypatch, source, 1, module, package)
    if fast is not None:
        assert same(fast, whole(monkeypatch, source, module=module, package=package))


BLOCK = """

def train_{i}(model, args):
    dp = groups._get_data_parallel_world_size()
    return dp
"""


def _file(*extra: str) -> str:
    return HEADER + "".join(BLOCK.format(i=i) for i in range(3)) + "".join(extra)


@pytest.mark.parametrize(
    "extra,reason",
    [
        ("\n\ndef train_1():\n    pass\n", "a name defined twice at the top level"),
        (
            "\n\ndef late():\n    from deepspeed.utils import groups\n    return groups._get_data_parallel_rank()\n",
            "an import in a definition",
        ),
        ("\n\ndef setter(grid):\n    groups.mpu = grid\n", "groups.mpu = ... (a file-wide fact)"),
        (
            "\n\ndef uses(model):\n    return deepspeed.initialize(model=model, mpu=torch)\n",
            "a module-level name as mpu",
        ),
        ("\n\nx = groups._get_data_parallel_rank()\n", "a statement after the definitions that is not one"),
        ("\n\ndef current_mesh():\n    return None\n", "a mesh_core name defined at the top level"),
        (
            "\n\ndef experts():\n    return groups._get_expert_parallel_world_size('ep_size_2')\n",
            "an expert site (file-wide)",
        ),
    ],
)
def test_each_condition_sends_the_file_down_the_whole_file_path(monkeypatch, extra, reason):
    source = _file(extra)
    assert pieces(monkeypatch, source) is None, reason
    assert pieces(monkeypatch, _file()) is not None


def test_a_mesh_core_name_bound_in_another_group_is_refused_or_the_same(monkeypatch):
    source = _file("\n\ndef other(current_mesh):\n    return current_mesh\n")
    fast = pieces(monkeypatch, source)
    assert fast is None or same(fast, whole(monkeypatch, source))
    assert fast is None


def test_unchanged_groups_are_kept_byte_for_byte(monkeypatch):
    plain = "\n\ndef table_{i}(x):\n    return {{'a': x}}  # data {i}\n"
    source = _file(*(plain.format(i=i) for i in range(4)))
    fast = pieces(monkeypatch, source)
    assert fast is not None and same(fast, whole(monkeypatch, source))
    assert fast.code.endswith("".join(plain.format(i=i) for i in range(4)))


def test_decorated_definitions_and_comments_between_them(monkeypatch):
    source = _file(
        "\n    # an indented comment after a definition (no cut before the next one)\n\ndef more():\n    return 1\n",
        "\n\n# a comment at column 0\n@staticmethod\n@property\ndef decorated():\n    return groups._get_data_parallel_rank()\n",
        "\n\nclass Kept:\n    '''Doc.'''\n\n    def m(self):\n        return groups._get_data_parallel_world_size()  # kept comment\n",
    )
    fast = pieces(monkeypatch, source)
    assert fast is not None and same(fast, whole(monkeypatch, source))


def test_the_runtime_lines_go_where_the_whole_file_puts_them(monkeypatch):
    block = """

def train_{i}(model, grid):
    engine, *_ = deepspeed.initialize(model=model, config={{"train_batch_size": 8}}, mpu=grid)
    return engine.get_data_parallel_world_size()
"""
    source = HEADER + "".join(block.format(i=i) for i in range(3))
    fast = pieces(monkeypatch, source)
    expected = whole(monkeypatch, source)
    assert fast is None or same(fast, expected)
