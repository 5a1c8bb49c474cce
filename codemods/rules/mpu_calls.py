"""Codemod: ``mpu.get_*()`` calls on an object passed to ``deepspeed.initialize`` as ``mpu``.

Where the mpu is provably a ``PipelineParallelGrid`` built in the same scope and the engine that
``deepspeed.initialize`` returned is in scope, ``mpu.get_data_parallel_group()`` becomes
``engine.mesh_device.get_group("dp")`` (grid semantics: "model parallel" is ``("pp", "tp")``).
Every other call on an mpu (a Megatron mpu, a parameter, ``self.mpu``) is left unchanged with a
``# TODOV1:`` saying which mesh call it maps to for each provider.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand, arg_by, find_all
from . import _grid_api as grid_api
from ._mesh_of import GETTERS as MESH_OF_GETTERS
from ._mesh_of import MANUAL as MESH_OF_MANUAL

KIND = "mpu call"
# the getters DeepSpeed 0.19.8 calls on an mpu (grep "mpu.get_" in its package)
PROTOCOL = frozenset(
    {*MESH_OF_GETTERS, *MESH_OF_MANUAL, *grid_api.METHODS}
    | {f"get_sequence_data_parallel_{what}" for what in ("group", "world_size", "rank")}
)


# source-rank getters of Megatron-style mpus (Megatron's get_tensor_model_parallel_src_rank is in
# MESH_OF_MANUAL) -> the dims whose group's first rank they return
SRC_RANKS = {"get_sequence_parallel_src_rank": '"sp"', "get_model_parallel_src_rank": '"tp"'}


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


UNKNOWN = "unknown"
GRID = "grid"


class _Collector(cst.CSTVisitor):
    """Collects the ``mpu=`` arguments of ``deepspeed.initialize`` calls."""

    def __init__(self, command: "MpuCallsCommand") -> None:
        self.command = command
        self.found: list[tuple[cst.BaseExpression, cst.Call]] = []

    def visit_Call(self, node: cst.Call) -> Optional[bool]:
        if self.command.could_be(node.func, {"initialize"}) and ln.INITIALIZE in self.command.legacy_names(node.func):
            mpu = arg_by(node, 7, "mpu")
            if mpu is not None:
                self.found.append((mpu.value, node))
            mesh = arg_by(node, None, "mesh")
            if mpu is None and mesh is not None:  # mpu=X that the initialize codemod made mesh=...from_mpu(X)
                self.found += [(a, node) for a in _from_mpu_args(mesh.value)]
        return True


def _from_mpu_args(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The arguments of the ``<...>.from_mpu(X)`` calls in ``value``."""
    return [
        c.args[0].value
        for c in find_all(value, cst.Call)
        if isinstance(c.func, cst.Attribute) and c.func.attr.value == "from_mpu" and len(c.args) == 1
    ]


def _imports_deepspeed(module: cst.Module) -> bool:
    """``module`` imports deepspeed (or a module of it) somewhere."""
    for node in find_all(module, cst.Import, cst.ImportFrom):
        if isinstance(node, cst.Import):
            if any(code(a.name).split(".")[0] == "deepspeed" for a in node.names):
                return True
        elif node.module is not None and not node.relative and code(node.module).split(".")[0] == "deepspeed":
            return True
    return False


class MpuCallsCommand(MigrationCommand):
    DESCRIPTION = "calls on the mpu passed to deepspeed.initialize -> engine mesh calls (or TODOV1)"
    IDENTIFIERS = (frozenset({"mpu"}),)
    MARKERS = (("mpu",), ("deepspeed",))

    def __init__(self, context) -> None:
        super().__init__(context)
        self._name_refs: dict[int, str] = {}  # id(Name node referring to an mpu) -> provenance
        self._grid_engines: dict[int, Optional[str]] = {}  # id(Name node of a grid) -> the engine it went to
        self._self_attrs: set[tuple[int, str]] = set()  # (id(ClassDef), attr) of self.<attr> mpus

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        super().visit_Module(node)
        collector = _Collector(self)
        node.visit(collector)
        for value, call in collector.found:
            if isinstance(value, cst.Name):
                self._track_name(value, self._engine_of(call))
            elif isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name):
                cls = self._enclosing_class(value)
                if cls is not None:
                    self._self_attrs.add((id(cls), value.attr.value))
        module = self.context.full_module_name or ""
        if _imports_deepspeed(node) and not module.startswith("deepspeed."):
            # a function parameter named mpu in a file that uses DeepSpeed: DeepSpeed's mpu protocol
            # (inside deepspeed the internal-mpu codemod answers; deepspeed.utils.bwc defines the probes)
            for param in find_all(node, cst.Param):
                if param.name.value == "mpu":
                    self._track_parameter(param.name)
        return True

    def _track_parameter(self, name: cst.Name) -> None:
        scope = self.scope_of(name)
        if scope is None:
            return
        bindings = scope.assignments[name.value]
        if len(bindings) != 1:  # rebound in the function: its value there is not the parameter's
            return
        for binding in bindings:
            for access in binding.references:
                self._name_refs.setdefault(id(access.node), UNKNOWN)

    def _engine_of(self, call: cst.Call) -> Optional[str]:
        """The engine name ``<engine>, ... = deepspeed.initialize(...)`` binds, or None."""
        node = self.parent(call)
        if isinstance(node, cst.Subscript):
            node = self.parent(node)
        if not isinstance(node, cst.Assign) or len(node.targets) != 1:
            return None
        dest = node.targets[0].target
        first = dest.elements[0].value if isinstance(dest, (cst.Tuple, cst.List)) and dest.elements else dest
        return first.value if isinstance(first, cst.Name) and self._is_engine_assign(node, first) else None

    def _track_name(self, name: cst.Name, engine: Optional[str]) -> None:
        scope = self.scope_of(name)
        if scope is None:
            return
        # the bindings visible here: a module-level mpu (``from megatron import mpu``) passed in a function
        bindings = scope.assignments[name.value] or scope[name.value]
        if ln.GROUPS in self.legacy_names(name):
            return  # the groups module as mpu: the groups codemod rewrites its calls
        provenance = self._provenance(bindings, scope)
        if provenance is None:
            return
        for binding in bindings:
            for access in binding.references:
                key = id(access.node)
                self._name_refs[key] = provenance
                # passed to two initialize calls: which engine holds its layout is not provable
                self._grid_engines[key] = engine if self._grid_engines.get(key, engine) == engine else None

    def _provenance(self, bindings, scope) -> Optional[str]:
        """``grid`` for a single local ``PipelineParallelGrid(...)``, None for the groups module
        (the groups codemod handles it) or a mesh, else ``unknown``."""
        if len(bindings) == 1:
            target = getattr(next(iter(bindings)), "node", None)
            if isinstance(target, cst.Name):
                assign = self.top_level_assign(target, scope)
                value = assign.value if assign is not None and len(assign.targets) == 1 else None
                if isinstance(value, cst.Call):
                    names = self.legacy_names(value.func)
                    if ln.GRID in names:
                        return GRID
                    if any(n.startswith("mesh_core.") for n in names):
                        return None
        return UNKNOWN

    def _enclosing_class(self, node: cst.CSTNode) -> Optional[cst.ClassDef]:
        current: Optional[cst.CSTNode] = node
        while current is not None and not isinstance(current, cst.ClassDef):
            current = self.parent(current)
        return current

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if not isinstance(func, cst.Attribute) or not func.attr.value.startswith("get_"):
            return updated_node
        method = func.attr.value
        provenance = self._name_refs.get(id(func.value))
        if provenance is None and self._is_self_mpu(func.value):
            provenance = UNKNOWN
        if provenance is None:
            return updated_node
        if provenance == UNKNOWN and method in SRC_RANKS:
            self.flag(
                KIND,
                f"mpu.{method}(): the source rank is the first rank of its group; once every mpu "
                "reaching here derives it that way (Megatron's parallel_state does), use "
                f"mesh_of(mpu).get_group_ranks({SRC_RANKS[method]})[0]",
            )
            return updated_node
        if provenance == UNKNOWN and method not in PROTOCOL:
            return updated_node  # the object's own API (NeoX's mpu.get_topology()), not DeepSpeed's mpu protocol
        template = grid_api.METHODS.get(method)
        mesh_hint = template.format(m="<mesh>") if template else "ds-migrate --explain mpu-call"
        if provenance == GRID:
            engine = self._grid_engines.get(id(func.value))
            if engine is not None and not self.engine_bound_at(original_node, engine):
                engine = None
            replacement = (
                grid_api.rewrite_use(f"{engine}.mesh_device", updated_node.func, updated_node) if engine else None
            )
            if replacement is not None:
                self.record(KIND)
                return cst.parse_expression(replacement)
            self.flag(KIND, f"grid.{method}(): after deepspeed.initialize use engine.mesh_device ({mesh_hint})")
            return updated_node
        query = MESH_OF_GETTERS.get(method)
        if query is not None and not original_node.args:
            # mesh_of(mpu) answers with this very getter of the mpu, whatever its provider (the mpu's
            # getter comes first in mesh_of's probe order for the dim): exact, with or without the shim
            self.record(KIND)
            new = cst.parse_expression(f"{self.mesh_ref('mesh_of')}({code(updated_node.func.value)}).{query}")
            return new.with_changes(lpar=original_node.lpar, rpar=original_node.rpar) if original_node.lpar else new
        if method in MESH_OF_MANUAL:
            self.flag(KIND, f"mpu.{method}(): {MESH_OF_MANUAL[method]}")
            return updated_node
        self.flag(
            KIND,
            f"mpu.{method}() on an mpu of unknown provider: use engine.mesh_device "
            + (
                f"(a PipelineParallelGrid maps to {mesh_hint}; ds-migrate --explain mpu-call for other providers)"
                if template
                else "(ds-migrate --explain mpu-call)"
            ),
        )
        return updated_node

    def _is_self_mpu(self, value: cst.BaseExpression) -> bool:
        if not (isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name)):
            return False
        cls = self._enclosing_class(value)
        return cls is not None and (id(cls), value.attr.value) in self._self_attrs
