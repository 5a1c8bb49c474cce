"""A differential referee for the codemods: legacy programs (one module or several) built from the
families of process-wide legacy state, run legacy on the real deepspeed 0.19.8 and migrated, without
and with ``compat.install()``, as ranks of fake-backend worlds; what each prints is compared.

A program is ``{module name: source}`` with ``"__main__"`` the script; the other modules are
imported by it (served from memory). :func:`programs` is the hypothesis strategy that builds them
from the families (builders and readers in one module or two; mpu kinds: none, a grid, an old and a
new Megatron-style mpu, the Ulysses module; import styles; guards); :func:`disagreements` runs one.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import io
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Optional

from codemod_scripts import _reset_legacy_groups, without_runtime
from fakepg import fake_world

MPU_KINDS = ("none", "grid", "old_megatron", "new_megatron", "ulysses")
FAMILIES = ("experts", "experts_internal", "autotp", "autotp_kept", "groups_mpu", "bwc", "initialize", "sp_getters")
STYLES = ("from_utils", "module_as", "alias", "dotted")
GUARDS = ("none", "try", "if")
INIT_STYLES = ("plain", "from", "as")

# --- the pieces programs are made of --------------------------------------------------------------
_GROUPS_IMPORT = {
    "from_utils": ("from deepspeed.utils import groups", "groups"),
    "module_as": ("import deepspeed.utils.groups as groups", "groups"),
    "alias": ("from deepspeed.utils import groups as G", "G"),
    "dotted": ("import deepspeed.utils.groups", "deepspeed.utils.groups"),
}
_INIT_IMPORT = {
    "plain": ("import deepspeed", "deepspeed.initialize"),
    "from": ("from deepspeed import initialize", "initialize"),
    "as": ("import deepspeed as ds", "ds.initialize"),
}

HELPERS = """
import torch.distributed as tdist


def ranks(group):
    return None if group is None else sorted(tdist.get_process_group_ranks(group))


def show(label, thunk):
    try:
        value = thunk()
        if isinstance(value, tdist.ProcessGroup):
            value = ranks(value)
        elif isinstance(value, range):
            value = list(value)
        print("OUT", label, value)
    except Exception as err:  # what a read raises is part of the output
        print("OUT", label, "raised", type(err).__name__)
"""

MPUS = {
    "none": "mpu = None\n",
    "grid": (
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid\n"
        "mpu = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp={pp}, num_mp={tp}, "
        "num_dp=tdist.get_world_size() // {ppt}))\n"
    ),
    "old_megatron": '''
class OldMpu:
    """A pre-pipeline Megatron mpu: model- and data-parallel getters only."""

    def __init__(self, tp):
        world, rank = tdist.get_world_size(), tdist.get_rank()
        self.tp = tp
        self.mp = [tdist.new_group(list(range(s, s + tp))) for s in range(0, world, tp)][rank // tp]
        self.dp = [tdist.new_group(list(range(i, world, tp))) for i in range(tp)][rank % tp]

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_rank(self):
        return tdist.get_rank() % self.tp

    def get_model_parallel_group(self):
        return self.mp

    def get_data_parallel_world_size(self):
        return tdist.get_world_size() // self.tp

    def get_data_parallel_rank(self):
        return tdist.get_rank() // self.tp

    def get_data_parallel_group(self):
        return self.dp


mpu = OldMpu({tp})
''',
    "new_megatron": '''
class NewMpu:
    """A Megatron parallel_state-like mpu (tensor, pipeline and data getters), pp = 1."""

    def __init__(self, tp):
        world, rank = tdist.get_world_size(), tdist.get_rank()
        self.tp = tp
        self.tpg = [tdist.new_group(list(range(s, s + tp))) for s in range(0, world, tp)][rank // tp]
        self.dpg = [tdist.new_group(list(range(i, world, tp))) for i in range(tp)][rank % tp]
        self.ppg = [tdist.new_group([r]) for r in range(world)][rank]

    def get_tensor_model_parallel_world_size(self):
        return self.tp

    def get_tensor_model_parallel_rank(self):
        return tdist.get_rank() % self.tp

    def get_tensor_model_parallel_group(self):
        return self.tpg

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_rank(self):
        return tdist.get_rank() % self.tp

    def get_model_parallel_group(self):
        return self.tpg

    def get_pipeline_model_parallel_world_size(self):
        return 1

    def get_pipeline_model_parallel_rank(self):
        return 0

    def get_pipeline_model_parallel_group(self):
        return self.ppg

    def get_data_parallel_world_size(self):
        return tdist.get_world_size() // self.tp

    def get_data_parallel_rank(self):
        return tdist.get_rank() // self.tp

    def get_data_parallel_group(self):
        return self.dpg


mpu = NewMpu({tp})
''',
    "ulysses": (
        "from deepspeed.runtime.sequence_parallel import parallel_state_sp\n"
        "parallel_state_sp._release_sequence_parallel_groups()\n"
        "parallel_state_sp.initialize_sequence_parallel({tp})\n"
        "mpu = parallel_state_sp\n"
    ),
}

CONFIG = (
    'config = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6, '
    '"optimizer": {"type": "Adam", "params": {"torch_adam": True}}}\n'
)


@dataclass(frozen=True)
class Spec:
    """One generated program's choices."""

    families: tuple
    mpu: str = "none"
    style: str = "from_utils"
    guard: str = "none"
    init_style: str = "plain"
    two_modules: bool = False
    world: int = 4
    tp: int = 2
    pp: int = 1

    def program(self) -> dict:
        return build(self)


def _guarded(lines: str, guard: str) -> str:
    if guard == "none":
        return lines
    body = textwrap.indent(lines, "    ")
    if guard == "try":
        return f"try:\n{body}except ImportError:\n    raise\n"
    return f"if tdist.is_available():\n{body}"


def build(spec: Spec) -> dict:
    """The legacy program of ``spec``: ``{"__main__": source}`` and, with ``two_modules``, a
    ``"state_helper"`` module holding the builders (imported by the script)."""
    groups_import, g = _GROUPS_IMPORT[spec.style]
    init_import, init = _INIT_IMPORT[spec.init_style]
    families = spec.families
    builders: list[str] = []
    readers: list[str] = []
    imports = {groups_import}
    if spec.mpu != "none" or "initialize" in families or "groups_mpu" in families or "bwc" in families:
        mpu_code = MPUS[spec.mpu].format(tp=spec.tp, pp=spec.pp, ppt=spec.pp * spec.tp)
    else:
        mpu_code = MPUS["none"]
    for family in families:
        if family == "experts":
            builders.append(f"{g}._create_expert_and_data_parallel(2)\n")
            readers.append(f'show("ep", lambda: list({g}._get_expert_parallel_group_ranks("ep_size_2")))\n')
            readers.append(f'show("edp", lambda: {g}._get_expert_data_parallel_group("ep_size_2"))\n')
        elif family == "experts_internal":
            imports.add("import deepspeed.runtime.utils as ds_utils")
            builders.append(f"{g}._create_expert_and_data_parallel(2)\n")
            readers.append(
                "import torch\n_p = torch.nn.Parameter(torch.zeros(1)); _p.grad = torch.ones(1); _p.allreduce = False\n"
                'show("overflow", lambda: ds_utils.CheckOverflow([[_p]]).check())\n'
            )
        elif family == "autotp":
            builders.append(f"{g}._init_tp_mesh_device({spec.tp})\n")
            readers.append(f'show("tp", lambda: {g}.get_tensor_model_parallel_group())\n')
            readers.append(f'show("tp size", lambda: {g}.get_tensor_model_parallel_world_size())\n')
            readers.append(f'show("dp", lambda: {g}.get_data_parallel_group())\n')
        elif family == "autotp_kept":
            builders.append(f"_dpg, _tpg = {g}._init_tp_mesh_device(tensor_model_parallel_size={spec.tp})\n")
            readers.append(f'show("tp", lambda: {g}.get_tensor_model_parallel_group())\n')
            readers.append(f'show("dp size", lambda: {g}.get_data_parallel_world_size())\n')
        elif family == "groups_mpu":
            builders.append(f"{g}.mpu = mpu\n")
            readers.append(f'show("udp", lambda: {g}._get_data_parallel_group())\n')
            readers.append(f'show("udp size", lambda: {g}._get_data_parallel_world_size())\n')
        elif family == "sp_getters":
            readers.append(f'show("sp size", lambda: {g}._get_sequence_parallel_world_size())\n')
            readers.append(f'show("sdp", lambda: {g}._get_sequence_data_parallel_group())\n')
        elif family == "bwc":
            imports.add(
                "from deepspeed.utils.bwc import bwc_pipeline_parallel_world_size, bwc_tensor_model_parallel_world_size"
            )
            readers.append('show("bwc pp", lambda: bwc_pipeline_parallel_world_size(mpu))\n')
            readers.append('show("bwc tp", lambda: bwc_tensor_model_parallel_world_size(mpu))\n')
        elif family == "initialize":
            imports.add(init_import)
            readers.append(
                "import torch\n"
                + CONFIG
                + f"engine, *_ = {init}(model=torch.nn.Linear(4, 4), config=config, mpu=mpu)\n"
                + 'show("engine dp", lambda: engine.dp_world_size)\n'
                + f'show("engine dp group", lambda: {g}._get_data_parallel_group())\n'
            )
    header = "import torch.distributed as tdist\n" + _guarded(
        "".join(f"{line}\n" for line in sorted(imports)), spec.guard
    )
    if spec.two_modules and builders:
        helper = header + "\n" + mpu_code + "".join(builders)
        main = header + "from state_helper import mpu\n" + HELPERS + "".join(readers)
        return {"state_helper": helper, "__main__": main}
    return {"__main__": header + HELPERS + mpu_code + "".join(builders) + "".join(readers)}


# --- running ------------------------------------------------------------------------------------
class _Served(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the program's modules (other than ``__main__``) from memory."""

    def __init__(self, modules: dict) -> None:
        self.modules = modules

    def find_spec(self, name, path=None, target=None):
        if name in self.modules:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(compile(self.modules[module.__name__], f"<{module.__name__}>", "exec"), module.__dict__)


def run(program: dict, rank: int, world: int, *, shim: bool, strip_runtime: bool = False) -> list[str]:
    """The ``OUT`` lines of ``program`` as ``rank`` of ``world`` on the real deepspeed (deepspeed.comm
    initialised), with ``compat.install()`` around the run when ``shim`` (and the program's own
    install lines taken out with ``strip_runtime``)."""
    import importlib

    from mesh_core import set_default_mesh

    installer = importlib.import_module("compat.install")
    sources = {name: without_runtime(code) if strip_runtime else code for name, code in program.items()}
    others = {name: code for name, code in sources.items() if name != "__main__"}
    served = _Served(others)
    _reset_legacy_groups()
    out = io.StringIO()
    sys.meta_path.insert(0, served)
    try:
        with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(out):
            if shim:
                installer.install()
            try:
                exec(compile(sources["__main__"], "<__main__>", "exec"), {"__name__": "__main__"})
            except Exception as err:  # noqa: BLE001 (what the program raised is part of its output)
                print(f"OUT raised {type(err).__name__}")
    finally:
        sys.meta_path.remove(served)
        for name in others:
            sys.modules.pop(name, None)
        if installer.is_installed():
            installer.uninstall()
        set_default_mesh(None)
        _release_ulysses()
        _forget_engines()
    return [line for line in out.getvalue().splitlines() if line.startswith("OUT")]


def _forget_engines() -> None:
    """Engines a run built under the shim do not outlive it (compat counts live engines: a previous
    run's engine would make the next run's legacy reads ambiguous)."""
    scope = sys.modules.get("compat.engine_scope")
    if scope is not None and scope._engines:
        scope._engines.clear()
        scope.settle()


def _release_ulysses() -> None:
    module = sys.modules.get("deepspeed.runtime.sequence_parallel.parallel_state_sp")
    if module is not None:
        module._release_sequence_parallel_groups()


def migrate(program: dict, migrate_code) -> dict:
    """Each module of ``program`` migrated on its own (as ``python -m codemods.migrate`` does)."""
    return {name: migrate_code(code).code for name, code in program.items()}


@dataclass
class Disagreement:
    rank: int
    world: int
    shim: object  # True, False or "as written"
    legacy: list = field(default_factory=list)
    migrated: list = field(default_factory=list)


def installs_runtime(program: dict) -> bool:
    return any(
        "compat.install()" in line and not line.lstrip().startswith("#")
        for code in program.values()
        for line in code.splitlines()
        if "TODOV1" not in line.split("#")[0]
    )


def disagreements(legacy: dict, migrated: dict, world: int, ranks) -> list[Disagreement]:
    """Where ``migrated`` prints something else than ``legacy``, for each rank: without the shim (the
    migration's own install lines taken out), with it, and, where the migration installs the mesh
    runtime itself, as written (its own ``compat.install()`` only) against legacy under the shim;
    without the shim is skipped there (the migrated program then needs the runtime)."""
    found = []
    needs = installs_runtime(migrated)
    for rank in ranks:
        modes = [("shim", True, False)] + ([("as written", True, None)] if needs else [("plain", False, True)])
        for _, shim, strip in modes:
            before = run(legacy, rank, world, shim=shim)
            after = run(migrated, rank, world, shim=bool(strip is not None and shim), strip_runtime=bool(strip))
            if after != before:
                found.append(Disagreement(rank, world, shim if strip is not None else "as written", before, after))
    return found


def strategy():
    """The hypothesis strategy of :class:`Spec` (families mixed, one module or two)."""
    from hypothesis import strategies as st

    return st.builds(
        Spec,
        families=st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=3, unique=True).map(tuple),
        mpu=st.sampled_from(MPU_KINDS),
        style=st.sampled_from(STYLES),
        guard=st.sampled_from(GUARDS),
        init_style=st.sampled_from(INIT_STYLES),
        two_modules=st.booleans(),
        world=st.sampled_from((4, 8)),
        tp=st.sampled_from((1, 2)),
        pp=st.just(1),
    )


def describe(spec: Spec, program: dict, migrated: Optional[dict] = None) -> str:
    parts = [repr(spec)]
    for name, code in program.items():
        parts.append(f"--- legacy {name}\n{code}")
        if migrated is not None:
            parts.append(f"--- migrated {name}\n{migrated[name]}")
    return "\n".join(parts)
