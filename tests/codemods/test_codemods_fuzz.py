"""Generated call shapes (multi-line, nested, starred, comments inside, in f-strings, stored on
``self`` / returned / passed on) of every kind of legacy site: the migration never raises, never
leaves a site unreported, writes code that compiles (Python 3.10 syntax), is a fixed point on a
second run, and keeps every line outside the sites byte for byte. A bounded budget (CI)."""

from __future__ import annotations

import ast
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codemods import migrate_code
from codemods._engine.portable import parse_error
from codemods._engine.todo_wrap import unwrap

HEADER = (
    "import deepspeed\n"
    "from deepspeed.utils import groups\n"
    "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipeDataParallelTopology, ProcessTopology\n"
    "from deepspeed.runtime.pipe.topology import PipelineParallelGrid\n"
)
GETTERS = (
    "get_data_parallel_group",
    "_get_data_parallel_world_size",
    "_get_data_parallel_rank",
    "get_model_parallel_world_size",
    "_get_expert_parallel_group",
    "_get_sequence_parallel_world_size",
    "_get_max_expert_size",
)
MPU_CALLS = (
    "get_model_parallel_world_size",
    "get_data_parallel_rank",
    "get_pipe_parallel_group",
    "get_data_parallel_group",
)
TODO_LINE = re.compile(r"# TODOV1: .+; ds-migrate --explain \S+$")
ATOMS = ("pp", "dp_size", "2", "self.cfg.pp", "int(args.pp)", "sizes[0]", "(a + b)", "f(x)[1]")


@st.composite
def layout(draw, parts: list[str]) -> str:
    """``parts`` (argument texts) between parentheses: on one line, one per line, with comments
    inside or a trailing comma."""
    if not parts:
        return "()" if draw(st.booleans()) else "(\n)"
    style = draw(st.sampled_from(["flat", "lines", "hanging", "comments"]))
    if style == "flat":
        return "(" + ", ".join(parts) + ")"
    if style == "hanging":
        return "(" + parts[0] + ("," + "\n        " + ", ".join(parts[1:]) if parts[1:] else "") + ")"
    comment = style == "comments"
    inner = "".join(f"        {p},{'  # arg ' + str(i) if comment else ''}\n" for i, p in enumerate(parts))
    return "(\n" + ("        # leading comment\n" if comment else "") + inner + "    )"


@st.composite
def topology_call(draw) -> str:
    kind = draw(st.sampled_from(["pmd", "pd", "process"]))
    atom = st.sampled_from(ATOMS)
    if kind == "process":
        axes = draw(st.sampled_from([["pipe", "data"], ["pipe", "data", "model"], ["data", "pipe"]]))
        dims = [draw(atom) for _ in axes]
        star = draw(st.booleans())
        parts = [f"axes={axes!r}", "dims=[*dims]" if star else "dims=[" + ", ".join(dims) + "]"]
        return "ProcessTopology" + draw(layout(parts))
    names = ["num_pp", "num_mp", "num_dp"] if kind == "pmd" else ["num_pp", "num_dp"]
    shape = draw(st.sampled_from(["keywords", "positional", "starred", "double-starred"]))
    if shape == "starred":
        parts = ["*sizes"]
    elif shape == "double-starred":
        parts = ["**sizes"]
    else:
        values = [draw(atom) for _ in names]
        parts = [f"{n}={v}" if shape == "keywords" else v for n, v in zip(names, values)]
    cls = "PipeModelDataParallelTopology" if kind == "pmd" else "PipeDataParallelTopology"
    return cls + draw(layout(parts))


@st.composite
def getter_call(draw) -> str:
    name = draw(st.sampled_from(GETTERS))
    args = ["name"] if name == "_get_expert_parallel_group" else []
    return f"groups.{name}" + draw(layout(args))


@st.composite
def site(draw) -> tuple[str, str]:
    """(the statement(s) of one site, indented for a method body; the kind of call)."""
    kind = draw(st.sampled_from(["topology", "getter", "grid", "nested"]))
    if kind == "topology":
        call = draw(topology_call())
    elif kind == "getter":
        call = draw(getter_call())
    elif kind == "grid":
        call = "PipelineParallelGrid" + draw(layout([f"topology={draw(topology_call())}"]))
    else:
        call = "print" + draw(layout([draw(getter_call()), f"*[{draw(getter_call())}]", "sep=','"]))
    where = draw(st.sampled_from(["self", "return", "local", "argument", "fstring", "lambda", "condition"]))
    if where == "fstring" and "\n" not in call and "'" not in call and '"' not in call:
        return f'        log(f"value={{{call}}} done")\n', kind
    if where == "self":
        return f"        self.value = {call}\n", kind
    if where == "return":
        return f"        return {call}\n", kind
    if where == "argument":
        return f"        use({call}, key=1)\n", kind
    if where == "lambda":
        return f"        self.later = lambda: {call}\n", kind
    if where == "condition":
        return f"        if {call}:\n            pass\n", kind
    return f"        value = {call}\n", kind


@st.composite
def program(draw) -> tuple[str, list[str]]:
    """A module with one class, several methods each holding a site between filler lines, and a
    ``deepspeed.initialize(mpu=mpu)`` with calls on that mpu (some in f-strings); and its filler lines."""
    fillers: list[str] = []
    methods = []
    for index in range(draw(st.integers(1, 4))):
        text, _ = draw(site())
        before = f"        marker_{index}_a = {index}  # keep {index}\n"
        after = f"        marker_{index}_b = [{index},\n            {index}]\n"
        fillers += [before, after]
        methods.append(f"    def m{index}(self, pp, dp_size, sizes, dims, name, args, a, b, x):\n{before}{text}{after}")
    mpu_call = draw(st.sampled_from(MPU_CALLS))
    in_fstring = draw(st.booleans())
    use = f'    print(f"{{mpu.{mpu_call}()}}")\n' if in_fstring else f"    n = mpu.{mpu_call}()\n"
    keyword = draw(st.sampled_from(["mpu=mpu", "mpu=mpu,\n        config=config", "config=config, mpu=mpu"]))
    train = (
        "def train(model, mpu, config):\n"
        "    filler_train = 1  # keep\n" + use + f"    engine, *_ = deepspeed.initialize(model=model, {keyword})\n"
        "    return engine\n"
    )
    fillers.append("    filler_train = 1  # keep\n")
    code = HEADER + "\n\nclass Model:\n" + "\n".join(methods) + "\n\n" + train
    return code, fillers


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program())
def test_generated_call_shapes_migrate_without_crash_and_compile(generated):
    source, fillers = generated
    ast.parse(source)  # the generator writes valid Python
    m = migrate_code(source)  # never raises
    assert not m.failures, m.failures  # no site left unreported
    assert parse_error(m.code) is None, m.code
    compile(m.code, "generated.py", "exec")
    for line in unwrap(m.code).splitlines():  # a TODOV1 comment is whole, ending with its link
        if "# TODOV1:" in line:
            assert TODO_LINE.search(line) and len(line.lstrip()) <= 100, line
    for line in m.code.splitlines():  # on lines within 100 characters, the indentation included
        assert "# TODOV1:" not in line and not line.lstrip().startswith("#   ") or len(line) <= 100, line
    position = 0
    for filler in fillers:  # lines outside the sites: byte for byte, in order
        found = m.code.find(filler, position)
        assert found != -1, (filler, m.code)
        position = found + len(filler)
    assert migrate_code(m.code).code == m.code  # a fixed point
