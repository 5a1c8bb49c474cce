"""The layout of what the codemods write: continuation lines stay aligned with an opening bracket a
rewrite moved, added imports go where isort's default profile puts them, and every line of a TODOV1
comment stays within 100 characters with its indentation. Each: on call sites of the shapes found in
Megatron-DeepSpeed / DeepSpeedExamples training scripts; a second run changes nothing; ``--check``
agrees; the piecewise path of a big file gives the same bytes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_codemods_chunks import pieces, same, whole

from codemods import migrate_code
from codemods._engine import todo_links
from codemods._engine.import_place import place_added_imports
from codemods._engine.realign import realign_code
from codemods._engine.runner import written_todos
from codemods._engine.todo_wrap import CONTINUATION, numbered, unwrap, wrap

REPO = Path(__file__).resolve().parents[2]


def aligned(first: str, *rest: str) -> str:
    """``first`` (a line ending after an open bracket and its first argument) and ``rest`` as lines
    aligned with that bracket (PEP 8's visual indent)."""
    stack = []
    for at, ch in enumerate(first):
        if ch in "([{":
            stack.append(at)
        elif ch in ")]}":
            stack.pop()
    column = stack[-1] + 1  # after the bracket still open at the end of the line
    return "\n".join([first, *(" " * column + line for line in rest)]) + "\n"


def _once_and_twice(source: str, **kwargs) -> str:
    once = migrate_code(source, **kwargs)
    twice = migrate_code(once.code, **kwargs)
    assert twice.code == once.code and not twice.sites  # idempotent
    compile(once.code, "migrated.py", "exec")
    return once.code


def _check(tmp_path: Path, name: str, source: str) -> tuple[int, int, str]:
    """(exit status of --check on ``source``, of --check after the migration wrote it, the written code)."""
    path = tmp_path / name
    path.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CODEMODS_CACHE_DIR": str(tmp_path / ".cache")}
    run = [sys.executable, "-m", "codemods.migrate", "--no-progress", "--no-cache"]
    before = subprocess.run([*run, "--check", name], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    wrote = subprocess.run([*run, name], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert wrote.returncode == 0, wrote.stderr
    after = subprocess.run([*run, "--check", name], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    return before.returncode, after.returncode, path.read_text()


# --- continuation lines -----------------------------------------------------------------------------
PIPELINE_SCRIPT = (  # DeepSpeedExamples' pipeline training script shape
    "import deepspeed\n"
    "from deepspeed.pipe import PipelineModule\n"
    "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipeDataParallelTopology\n"
    "\n\n"
    "def model(args, layers, world):\n"
    + aligned(
        "    net = PipelineModule(layers=layers,",
        "topology=PipeModelDataParallelTopology(num_pp=args.pipeline_parallel_size,",
    )[:-1]
    + "\n"
    + aligned(
        "                         topology=PipeModelDataParallelTopology(num_pp=args.pipeline_parallel_size,",
        "num_mp=1,",
        "num_dp=world // args.pipeline_parallel_size),",
    ).split("\n", 1)[1]
    + '                         partition_method="parameters")\n'
    + aligned("    topo = PipeDataParallelTopology(num_pp=args.pp,", "num_dp=world // args.pp)")
    + aligned("    return net, PipelineModule(layers=layers, topology=topo,", "loss_fn=None)")
)


def test_a_rewritten_topology_keeps_its_arguments_aligned_with_its_bracket(tmp_path):
    code = _once_and_twice(PIPELINE_SCRIPT)
    assert (
        aligned(
            "                         topology=pipeline_topology(pp=args.pipeline_parallel_size,",
            "tp=1,",
            "dp=world // args.pipeline_parallel_size),",
        )
        in code
    )
    assert aligned("    topo = pipeline_topology(pp=args.pp,", "dp=world // args.pp)") in code
    # the call around it did not change its head: its lines stay where they were
    assert "    net = PipelineModule(layers=layers,\n                         topology=pipeline_topology(" in code
    assert aligned("    return net, PipelineModule(layers=layers, topology=topo,", "loss_fn=None)") in code
    assert _check(tmp_path, "train.py", PIPELINE_SCRIPT) == (1, 0, code)


def test_a_getter_before_a_bracket_on_its_line_moves_the_lines_aligned_with_that_bracket():
    source = (
        "import torch\nimport deepspeed\nfrom deepspeed.utils import groups\n\n\n"
        "def shard(tensor, world, step):\n"
        + aligned("    for rank in range(groups._get_data_parallel_rank(), world,", "step):")  # a header
        + "        tensor = tensor + rank\n"
        + aligned("    if groups._get_data_parallel_world_size() > 1 and torch.any(tensor,", "dim=0):")
        + "        pass\n"
        + aligned("    index = groups._get_data_parallel_rank() * step + torch.arange(step,", "device=tensor.device)")
        + aligned("    world = groups._get_data_parallel_world_size(); v = max(torch.ones(2,", "3),")
        + " " * len("    world = groups._get_data_parallel_world_size(); v = max(")
        + "step)\n"
        + "    return index, v\n"
    )
    code = _once_and_twice(source)
    assert aligned('    for rank in range(current_mesh().get_local_rank("dp"), world,', "step):") in code
    assert aligned('    if current_mesh().size("dp") > 1 and torch.any(tensor,', "dim=0):") in code
    assert (
        aligned('    index = current_mesh().get_local_rank("dp") * step + torch.arange(step,', "device=tensor.device)")
        in code
    )
    # nested: the inner bracket's line moves with the outer one, then its own line follows it
    line = '    world = current_mesh().size("dp"); v = max(torch.ones(2,'
    assert line + "\n" + " " * (line.rindex("(") + 1) + "3),\n" + " " * (line.index("max(") + 4) + "step)\n" in code


def test_grid_methods_rewritten_before_a_bracket_keep_a_dict_aligned():
    source = (  # Megatron-DeepSpeed's logging of the grid's sizes
        "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid\n\n\n"
        "def build(pp, dp):\n"
        "    grid = PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=pp, num_dp=dp))\n"
        + aligned(
            '    print("sizes", grid.get_data_parallel_world_size(), grid.get_pipe_parallel_world_size(), {"a": 1,',
            '"b": 2})',
        )
        + "    return grid.get_data_parallel_group()\n"
    )
    code = _once_and_twice(source)
    assert aligned('    print("sizes", grid.size("dp"), grid.size("pp"), {"a": 1,', '"b": 2})') in code


def test_hanging_indents_and_lines_not_aligned_stay_where_they_were():
    source = (
        "import deepspeed\nfrom deepspeed.runtime.pipe.topology import PipeDataParallelTopology\n\n\n"
        "def model(layers, world):\n"
        "    topo = PipeDataParallelTopology(\n        num_pp=2,\n        num_dp=world // 2)\n"
        "    other = PipeDataParallelTopology(num_pp=2,\n            num_dp=world // 2)\n"
        "    net = deepspeed.pipe.PipelineModule(layers=layers, topology=topo)\n"
        "    return net, deepspeed.pipe.PipelineModule(layers=layers, topology=other)\n"
    )
    code = _once_and_twice(source)
    assert "    topo = pipeline_topology(\n        pp=2,\n        dp=world // 2)\n" in code
    assert "    other = pipeline_topology(pp=2,\n            dp=world // 2)\n" in code


def test_realign_code_moves_only_lines_aligned_with_a_moved_bracket():
    old = aligned("x = long_name(a,", "b,", "c)") + "y = 1\n"
    assert realign_code(old, old.replace("long_name", "f")) == aligned("x = f(a,", "b,", "c)") + "y = 1\n"
    text = '"""a\n   b(\n"""'
    kept = f"x = long_name({text},\n              c)\n"  # a line inside a string is never touched
    assert realign_code(kept, kept.replace("long_name", "f")) == f"x = f({text},\n      c)\n"
    assert realign_code("x = f(a,\n  b)\n", "x = ff(a,\n  b)\n") == "x = ff(a,\n  b)\n"  # not aligned


# --- added imports ----------------------------------------------------------------------------------
ISORTED = '''"""Pretrain GPT with pipeline parallelism."""
from __future__ import annotations

import argparse
import os

import deepspeed
import torch
from deepspeed.utils import groups
from torch import nn

from mypkg.model import Net


def main():
    return groups._get_data_parallel_world_size(), groups._get_sequence_parallel_group()
'''


def test_an_added_import_joins_the_third_party_group_in_sorted_place(tmp_path):
    code = _once_and_twice(ISORTED)
    head = code.split("\n\n\ndef ")[0]
    assert head == ISORTED.split("\n\n\ndef ")[0].replace(
        "from deepspeed.utils import groups\n", "from mesh_core import current_mesh\n"
    )
    assert _check(tmp_path, "pretrain.py", ISORTED) == (1, 0, code)


def test_straight_imports_go_before_from_imports_and_names_are_sorted():
    source = (
        "import os\nimport deepspeed\nfrom deepspeed.utils import groups\n"
        "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid\n"
        "from megatron import get_args\nimport mypkg\n\n\n"
        "def main(layers):\n"
        "    grid = PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=2, num_dp=2))\n"
        "    topo = PipeDataParallelTopology(num_pp=2, num_dp=2)\n"
        "    net = deepspeed.pipe.PipelineModule(layers=layers, topology=topo)\n"
        "    groups._clone_world_group()\n"
        "    return grid.get_data_parallel_group(), groups._get_data_parallel_group(), net\n"
    )
    code = _once_and_twice(source)
    # (an unsorted group: the from-import after the group's last third-party import, the straight one
    # before its first third-party from-import)
    assert code.startswith(
        "import os\nimport deepspeed\nimport torch.distributed\nfrom megatron import get_args\nimport mypkg\n"
        "from mesh_core import DeepSpeedDeviceMesh, current_mesh, pipeline_topology\n\n\n"
    )


def test_runtime_lines_future_imports_and_guards_keep_their_places():
    script = (
        '"""Doc."""\nfrom __future__ import annotations\n\nimport torch\nimport deepspeed\n'
        "from deepspeed.runtime.pipe.topology import PipelineParallelGrid\nfrom megatron import mpu\n\n\n"
        "def main(model, grid):\n"
        '    engine, *_ = deepspeed.initialize(model=model, config={"train_batch_size": 8}, mpu=grid)\n'
        "    return mpu.get_data_parallel_rank()\n"
    )
    code = _once_and_twice(script)
    assert code.index("import compat\ncompat.install()") < code.index("import deepspeed\n")
    assert code.index("from __future__") < code.index("import compat") and code.startswith('"""Doc."""\n')
    guarded = (
        "import os\ntry:\n    import deepspeed\n    from deepspeed.utils import groups\nexcept ImportError:\n"
        "    deepspeed = None\n\n\ndef main():\n    return groups._get_data_parallel_world_size()\n"
    )
    assert _once_and_twice(guarded).startswith(
        "import os\ntry:\n    import deepspeed\n    from mesh_core import current_mesh\nexcept ImportError:\n"
    )


def test_without_a_deepspeed_or_torch_group_the_import_stays_after_the_last_one():
    source = (
        "import os\n\nfrom deepspeed.utils import groups\nimport mypkg\n\n\ndef f():\n"
        "    return groups._get_data_parallel_world_size()\n"
    )
    code = _once_and_twice(source)
    assert code.startswith("import os\nimport mypkg\nfrom mesh_core import current_mesh\n\n\ndef f():")


MEGATRON_TRAINING = '''"""Pretrain utilities."""
from datetime import datetime
import math
import time
try:
    import wandb
except (ImportError, ModuleNotFoundError):
    wandb = None
# The earliest we can measure the start time.
_TRAIN_START_TIME = time.time()
import torch

from megatron import get_args
from megatron.core import mpu

import deepspeed
from deepspeed.accelerator import get_accelerator
from megatron.model.transformer import ParallelTransformerLayer

from deepspeed import comm as dist


def setup_model(model, args):
    model, _, _, _ = deepspeed.initialize(model=model, args=args, mpu=mpu if args.no_pp else None,
                                          config=args.deepspeed_config_dict)
    return mpu.get_data_parallel_world_size() * args.micro_batch_size
'''


def test_megatron_training_shape_the_import_goes_into_the_deepspeed_group_after_the_start_time():
    code = _once_and_twice(MEGATRON_TRAINING)
    assert "import compat\ncompat.install()  # the mesh runtime" in code
    assert (
        "import deepspeed\nfrom deepspeed.accelerator import get_accelerator\n"
        "from megatron.model.transformer import ParallelTransformerLayer\n"
        "from mesh_core import DeepSpeedDeviceMesh, mesh_of\n\nfrom deepspeed import comm as dist\n"
    ) in code
    assert code.index("_TRAIN_START_TIME = time.time()") < code.index("import compat") < code.index("from mesh_core")


def test_an_added_import_never_moves_below_a_statement_that_uses_it():
    source = (
        "import os\nfrom deepspeed.utils import groups\nWORLD = groups._get_data_parallel_world_size()\n"
        "import torch\nimport deepspeed\n\n\ndef f():\n    return WORLD\n"
    )
    code = _once_and_twice(source)
    assert code.index("from mesh_core import current_mesh") < code.index("WORLD = current_mesh()")


def test_the_users_imports_never_move():
    import libcst as cst

    source = cst.parse_module("import torch\nimport deepspeed\nfrom torch import nn\n\nx = 1\n")
    tree = cst.parse_module(
        "import torch\nimport deepspeed\nfrom torch import nn\nfrom mesh_core import b, A\n\nx = 1\n"
    )
    placed = place_added_imports(source, tree).code
    assert placed == "import torch\nimport deepspeed\nfrom mesh_core import A, b\nfrom torch import nn\n\nx = 1\n"
    assert place_added_imports(source, source) is source


def test_the_piecewise_path_places_imports_and_wraps_comments_as_the_whole_file(monkeypatch):
    header = (
        "import os\n\nimport deepspeed\nimport torch\nfrom deepspeed.utils import groups\n"
        "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid\n"
        "from torch import nn\n"
    )
    block = (
        "\n\nclass Block{i}(nn.Module):\n    def forward(self, x):\n        if x:\n            for y in x:\n"
        "                with y:\n"
        "                    self.grid = PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=2, num_dp={i}))\n"
        "        return groups._get_data_parallel_world_size(), self.grid\n"
    )
    source = header + "".join(block.format(i=i) for i in range(4))
    expected = whole(monkeypatch, source)
    fast = pieces(monkeypatch, source)
    assert fast is not None and same(fast, expected)
    assert (
        "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid\n"
        "from mesh_core import current_mesh\nfrom torch import nn\n" in expected.code
    )
    comments = [line for line in expected.code.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) == 8 and all(len(line) <= todo_links.MAX_COMMENT for line in comments)
    assert sum(line.lstrip().startswith(CONTINUATION) for line in comments) == 4


# --- comments within 100 characters -----------------------------------------------------------------
LONG = "# TODOV1: use DeepSpeedDeviceMesh.build(pp=P, dp=D, tp=T); ds-migrate --explain PipelineParallelGrid"


@pytest.mark.parametrize("indent", [0, 4, 8, 16, 24, 40, 60])
def test_wrap_keeps_every_line_within_100_characters_never_cuts_a_word_and_keeps_the_pointer(indent):
    lines = wrap(LONG, indent)
    assert all(indent + len(line) <= todo_links.MAX_COMMENT for line in lines), lines
    assert lines[0].startswith("# TODOV1: ") and all(line.startswith(CONTINUATION) for line in lines[1:])
    assert " ".join([lines[0], *(line[len(CONTINUATION) :] for line in lines[1:])]) == LONG  # every word whole
    if indent + len(CONTINUATION + "ds-migrate --explain PipelineParallelGrid") <= 100:
        assert any(line.endswith("ds-migrate --explain PipelineParallelGrid") for line in lines)
    code = "".join(" " * indent + line + "\n" for line in lines) + " " * indent + "x = 1\n"
    assert unwrap(code) == " " * indent + LONG + "\n" + " " * indent + "x = 1\n"
    assert numbered(code.splitlines(keepends=True))[0] == (1, " " * indent + LONG + "\n")
    assert wrap(LONG, 0) == [LONG]


DEEP = """from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid


class Trainer:
    def build(self, stages):
        for stage in stages:
            if stage.pipelined:
                with stage.lock:
                    self.grid = PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=2, num_dp=2))
        return self.grid
"""


def test_a_comment_above_a_deeply_indented_statement_wraps_within_100_characters(tmp_path):
    code = _once_and_twice(DEEP)
    lines = code.splitlines()
    at = next(i for i, line in enumerate(lines) if "# TODOV1:" in line)
    assert lines[at].startswith(" " * 20 + "# TODOV1: ") and lines[at + 1].startswith(" " * 20 + CONTINUATION)
    assert lines[at + 2].lstrip().startswith("self.grid = PipelineParallelGrid(")
    assert all(len(line) <= todo_links.MAX_COMMENT for line in lines if line.lstrip().startswith("#"))
    assert len(unwrap(code).splitlines()[at]) > todo_links.MAX_COMMENT  # what one line would have been
    m = migrate_code(DEEP)
    comment = unwrap(code).splitlines()[at].strip()
    assert list(m.advice) == [comment] and re.search(r"; ds-migrate --explain \S+$", comment)
    assert written_todos(DEEP, code, m.advice) == [(at + 1, comment, m.advice[comment])]  # listed at its first line
    assert "# TODOV1: " + "; ".join(m.advice[comment]) in m.spelled_out()  # the full advice, read whole
    before, after, written = _check(tmp_path, "trainer.py", DEEP)
    assert (before, after, written) == (1, 0, code)


@pytest.mark.deepspeed
@pytest.mark.parametrize("relative", ["moe/layer.py", "runtime/pipe/module.py"])
def test_comments_in_deepspeeds_own_deeply_indented_code_stay_within_100_characters(relative):
    from test_codemods_metadata import deepspeed_file

    module = "deepspeed." + relative[: -len(".py")].replace("/", ".")
    source = deepspeed_file(relative).read_text(encoding="utf-8")
    m = migrate_code(source, module=module, package=module.rpartition(".")[0])
    written = [
        line
        for line in set(m.code.splitlines()) - set(source.splitlines())
        if "# TODOV1:" in line or line.lstrip().startswith(CONTINUATION)
    ]
    assert any(line.lstrip().startswith(CONTINUATION) for line in written)  # these files need the wrapping
    assert all(len(line) <= todo_links.MAX_COMMENT for line in written)
    assert set(_todo_comments(m.code)) == set(m.advice)


def _todo_comments(code: str) -> list[str]:
    return [line[line.index("# TODOV1:") :] for line in unwrap(code).splitlines() if "# TODOV1:" in line]


def test_a_realigned_statement_keeps_its_own_comment_and_gets_its_todo_above():
    source = (
        "import deepspeed\nfrom deepspeed.utils import groups\n\n\ndef f(engine):\n"
        + aligned(
            "    world = groups._get_data_parallel_world_size(); v = max(groups._get_model_parallel_world_size(),",
            "1)  # mine",
        )
        + "    return world, v\n"
    )
    code = _once_and_twice(source)
    head = '    world = current_mesh().size("dp"); v = max(groups._get_model_parallel_world_size(),'
    assert '    # TODOV1: use <mesh>.size(("pp", "tp"))' in code
    assert aligned(head, "1)  # mine") in code
