"""Codemod: ``deepspeed.initialize(..., mpu=..., mesh_param=...)`` → the config ``"mesh"`` section.

``mesh_param=(dp, sp)`` becomes ``"mesh": {"dp": dp, "sp": sp}``; ``mpu=<mesh>`` where the mesh is a
local ``DeepSpeedDeviceMesh.build(pp=.., dp=.., tp=..)`` (what the topology codemod makes of a
``PipelineParallelGrid``) becomes ``"mesh": {"pp": .., "dp": .., "tp": ..}``. The section is added
to the config dict literal passed to the call, or to the dict literal a local config name is bound
to. Anything else (an mpu of unknown provenance, a config file path) gets a ``# TODOV1:``.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand, arg_by, find_all
from . import _mpu_class as mpu_class

KIND_MESH_PARAM = "initialize mesh_param"
KIND_MPU = "initialize mpu"
MESH_BUILD = "mesh_core.DeepSpeedDeviceMesh.build"
MESH_KEYS = ("pp", "dp", "dp_replicate", "dp_shard", "sp", "tp", "order")


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _is_pure(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Integer, cst.Name, cst.SimpleString)):
        return True
    if isinstance(node, cst.List):
        return all(_is_pure(e.value) for e in node.elements)
    return isinstance(node, cst.Attribute) and _is_pure(node.value)


def dict_keys(node: cst.Dict) -> set[str]:
    keys = set()
    for element in node.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            keys.add(str(element.key.evaluated_value))
    return keys


def _given(arg: Optional[cst.Arg]) -> Optional[cst.Arg]:
    """``arg``, or None where it is absent or a literal ``None`` (the default)."""
    return None if arg is None or (isinstance(arg.value, cst.Name) and arg.value.value == "None") else arg


def with_entry(node: cst.Dict, entry: str) -> cst.Dict:
    """``node`` with ``entry`` (``"key": value`` code) appended, in the dict's own layout."""
    element = cst.parse_expression("{" + entry + "}").elements[0]  # type: ignore[attr-defined]
    elements = list(node.elements)
    if not elements:
        return node.with_changes(elements=[element])
    last = elements[-1]
    previous = elements[-2].comma if len(elements) > 1 else None
    if isinstance(last.comma, cst.Comma):
        separator = previous if isinstance(previous, cst.Comma) else last.comma
        ws = separator.whitespace_after
        if isinstance(ws, cst.SimpleWhitespace) and ws.value == "":
            separator = separator.with_changes(whitespace_after=cst.SimpleWhitespace(" "))
        element = element.with_changes(comma=last.comma)
    else:
        separator = (
            previous if isinstance(previous, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
    elements[-1] = last.with_changes(comma=separator)
    return node.with_changes(elements=elements + [element])


def without_args(call: cst.Call, drop: list[cst.Arg]) -> cst.Call:
    """``call`` without the (keyword) arguments ``drop``, keeping the last comma's style."""
    kept = [a for a in call.args if not any(a is d for d in drop)]
    if kept and kept[-1] is not call.args[-1]:
        kept[-1] = kept[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=kept)


class InitializeCommand(MigrationCommand):
    DESCRIPTION = 'deepspeed.initialize(mpu=, mesh_param=) -> config "mesh" section'
    IDENTIFIERS = (frozenset({"initialize"}), frozenset({"mpu", "mesh_param"}))
    MARKERS = (("initialize",), ("mpu", "mesh_param"))

    def __init__(self, context) -> None:
        super().__init__(context)
        self._dict_entries: dict[int, list[str]] = {}
        self._call_drops: dict[int, tuple[list[int], list[str]]] = {}
        self._call_flags: dict[int, list[tuple[str, str]]] = {}
        self._from_mpu: dict[int, tuple[str, None]] = {}  # id(mpu= Arg) -> how to wrap it
        self._mesh_for: dict[int, str] = {}  # id(mpu= Arg) -> the mesh that stands for the mpu class instance
        self._dropped: set[int] = set()  # ids of ``mpu = C(mesh)`` statements nothing else reads

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        super().visit_Module(node)
        self._wrappers = mpu_class.module_wrappers(node)
        for call in find_all(node, cst.Call):
            if self.could_be(call.func, {"initialize"}) and ln.INITIALIZE in self.legacy_names(call.func):
                self._plan(call)
        return True

    def _defer(self, call: cst.Call, kind: str, message: str) -> None:
        self._call_flags.setdefault(id(call), []).append((kind, message))

    def visit_Call(self, node: cst.Call) -> Optional[bool]:
        for kind, message in self._call_flags.pop(id(node), []):
            self.flag(kind, message)
        return True

    def _plan(self, node: cst.Call) -> None:
        mesh_param, mpu = (_given(arg_by(node, *at)) for at in ((11, "mesh_param"), (7, "mpu")))
        if mesh_param is None and mpu is None:
            return
        entries: list[str] = []
        drops: list[cst.Arg] = []
        kinds: list[str] = []
        if mesh_param is not None:
            sizes = self._mesh_param_sizes(mesh_param)
            if sizes is None:
                self._defer(
                    node, KIND_MESH_PARAM, 'put mesh_param=(dp, sp) into the config as "mesh": {"dp": dp, "sp": sp}'
                )
            else:
                entries += sizes
                drops.append(mesh_param)
                kinds.append(KIND_MESH_PARAM)
        if mpu is not None:
            sizes = self._mpu_sizes(mpu)
            if sizes is None:
                if mesh_param is None and self._plan_class_mesh(node, mpu):
                    mpu = None
                elif mesh_param is None and self._plan_from_mpu(node, mpu):
                    mpu = None
                elif (
                    mesh_param is None
                    and isinstance(mpu.value, cst.Call)
                    and mpu.keyword is not None
                    and arg_by(node, None, "mesh") is None
                ):
                    # the obstacle is evaluating the call twice (mesh=... from_mpu(<call>) if <call> ...)
                    call = " ".join(cst.Module([]).code_for_node(mpu.value).split())
                    self._defer(
                        node,
                        KIND_MPU,
                        f"mpu={call} is a call: bind it to a name first (mpu = {call}), pass "
                        "mpu=mpu, and migrate again (mpu= then becomes mesh=DeepSpeedDeviceMesh.from_mpu(mpu))",
                    )
                else:
                    self._defer(
                        node,
                        KIND_MPU,
                        'the layout of this mpu cannot be proven here: describe it in the config "mesh" section (pp/dp/tp/sp) and drop mpu=, or pass mesh=DeepSpeedDeviceMesh.from_mpu(mpu)',
                    )
            else:
                entries += sizes
                drops.append(mpu)
                kinds.append(KIND_MPU)
        if not drops:
            return
        if not entries:  # only mpu= -> mesh=from_mpu(...), planned above
            return
        target = self.config_dict(node)
        if target is None:
            for kind in kinds:
                self._defer(node, kind, 'add "mesh": {' + ", ".join(entries) + "} to the config, drop mpu=/mesh_param=")
            return
        if "mesh" in dict_keys(target) or id(target) in self._dict_entries:
            for kind in kinds:
                self._defer(
                    node, kind, 'the config already has a "mesh" section; merge {' + ", ".join(entries) + "} into it"
                )
            return
        added = ['"mesh": {' + ", ".join(entries) + "}"]
        if any(e.startswith('"tp": ') and e != '"tp": 1' for e in entries):
            # under the mesh runtime a "mesh" tp alone turns on AutoTP sharding; the legacy mpu only
            # named tp groups (the model does its own TP): autotp_size 0 keeps it that way
            if "tensor_parallel" in dict_keys(target):
                for kind in kinds:
                    self._defer(
                        node,
                        kind,
                        'add "mesh": {' + ", ".join(entries) + '} and set "tensor_parallel": '
                        '{"autotp_size": 0} unless AutoTP should shard the model, then drop mpu=',
                    )
                return
            added.append('"tensor_parallel": {"autotp_size": 0}')
        self._dict_entries[id(target)] = added
        self._call_drops[id(node)] = ([id(a) for a in drops], kinds)
        return

    def _plan_class_mesh(self, call: cst.Call, arg: cst.Arg) -> bool:
        """``mpu=<name>``, the name bound once to ``C(<mesh>)`` where ``C`` is a hand-written mpu
        class over a grid (:mod:`codemods.rules._mpu_class`) whose getters answer as the mesh
        does, and ``<mesh>`` the ``DeepSpeedDeviceMesh.build(...)`` its grid became → ``mesh=<mesh>``;
        the ``<name> = C(<mesh>)`` statement goes too where nothing else reads the name."""
        if arg.keyword is None or arg_by(call, None, "mesh") is not None or not isinstance(arg.value, cst.Name):
            return False
        scope = self.scope_of(arg.value)
        made = self.bound_value(arg.value)
        if (
            scope is None
            or len(scope.assignments[arg.value.value]) != 1
            or not isinstance(made, cst.Call)
            or not isinstance(made.func, cst.Name)
            or made.func.value not in self._wrappers
        ):
            return False
        wrapper = self._wrappers[made.func.value]
        if len(wrapper.params) != 1:
            return False
        mesh = mpu_class.grid_argument(wrapper, made, next(iter(wrapper.params)))
        build = self.bound_value(mesh) if isinstance(mesh, cst.Name) else None
        if not isinstance(build, cst.Call) or MESH_BUILD not in {q.name for q in self.get_metadata_safe(build.func)}:
            return False
        if len(self.scope_of(mesh).assignments[mesh.value]) != 1:
            return False
        pp = arg_by(build, None, "pp")
        if any(a.keyword is None or a.star for a in build.args):
            return False
        pp_is_one = pp is None or (isinstance(pp.value, cst.Integer) and pp.value.value == "1")
        if not mpu_class.answers_as_mesh(wrapper, pp_is_one):
            return False
        self._mesh_for[id(arg)] = mesh.value
        binding = next(iter(scope.assignments[arg.value.value]))
        statement = self.parent(self.parent(binding.node)) if isinstance(binding.node, cst.Name) else None
        if len(binding.references) == 1 and isinstance(statement, cst.Assign):
            line = self.parent(statement)
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                self._dropped.add(id(line))
        return True

    def on_statement(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine):
        if id(original_node) in self._dropped:
            return cst.RemoveFromParent()
        return updated_node

    def _plan_from_mpu(self, call: cst.Call, arg: cst.Arg) -> bool:
        """``mpu=X`` whose layout is only known at run time → ``mesh=DeepSpeedDeviceMesh.from_mpu(X)``
        (the mesh adopts X's groups). ``X if cond else None`` keeps its condition; a name that may be
        None is guarded. A local ``PipelineParallelGrid`` is left to the grid rules."""
        if arg.keyword is None or arg_by(call, None, "mesh") is not None:
            return False
        value = arg.value
        if isinstance(value, cst.IfExp):
            none_branch = [b for b in (value.body, value.orelse) if isinstance(b, cst.Name) and b.value == "None"]
            mpu_branch = [b for b in (value.body, value.orelse) if not (isinstance(b, cst.Name) and b.value == "None")]
            if len(none_branch) != 1 or not self._runtime_mpu(mpu_branch[0]):
                return False
            self._from_mpu[id(arg)] = ("ifexp", None)
            return True
        if not self._runtime_mpu(value):
            return False
        self._from_mpu[id(arg)] = ("guard" if not self._never_none(value) else "plain", None)
        return True

    def _runtime_mpu(self, value: cst.BaseExpression) -> bool:
        """A name or attribute chain that is not a local grid / mesh / the groups module."""
        node = value
        while isinstance(node, cst.Attribute):
            node = node.value
        if not isinstance(node, cst.Name):
            return False
        names = self.legacy_names(value)
        if ln.GROUPS in names or any(n.startswith("mesh_core") for n in names):
            return False
        if isinstance(value, cst.Name):
            bound = self.bound_value(value)
            if isinstance(bound, cst.Call) and (
                ln.GRID in self.legacy_names(bound.func)
                or any(n.startswith("mesh_core") for n in self.legacy_names(bound.func))
            ):
                return False
        return True

    def _never_none(self, value: cst.BaseExpression) -> bool:
        """``value`` names a module bound by ``import`` or an instance of a class the module defines
        (``from x import name`` may bind any value, a None among them: it gets the guard, which a
        module passes)."""
        if not isinstance(value, cst.Name):
            return False
        scope = self.scope_of(value)
        if scope is None:
            return False
        made = self.bound_value(value)
        if isinstance(made, cst.Call) and isinstance(made.func, cst.Name) and len(scope.assignments[value.value]) == 1:
            # an instance of a class this module defines (``mpu = MPU(...)``) is never None
            defined = self.scope_of(made.func)
            classes = defined[made.func.value] if defined is not None else ()
            if classes and all(isinstance(getattr(b, "node", None), cst.ClassDef) for b in classes):
                return True
        bindings = scope.assignments[value.value]
        return bool(bindings) and all(isinstance(getattr(b, "node", None), cst.Import) for b in bindings)

    def _mesh_param_sizes(self, arg: cst.Arg) -> Optional[list[str]]:
        if arg.keyword is None:
            return None
        value = arg.value
        if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == 2:
            if any(isinstance(e, cst.StarredElement) for e in value.elements):
                return None
            dp, sp = (code(e.value) for e in value.elements)
            return [f'"dp": {dp}', f'"sp": {sp}']
        return None

    def _mpu_sizes(self, arg: cst.Arg) -> Optional[list[str]]:
        """Mesh entries of an mpu that is a local ``DeepSpeedDeviceMesh.build(...)``."""
        if arg.keyword is None or not isinstance(arg.value, cst.Name):
            return None
        build = self.bound_value(arg.value)
        if not isinstance(build, cst.Call):
            return None
        names = {q.name for q in self.get_metadata_safe(build.func)}
        if MESH_BUILD not in names:
            return None
        entries = []
        for a in build.args:
            if a.keyword is None or a.star:
                return None
            key = a.keyword.value
            if key in MESH_KEYS:
                if not _is_pure(a.value):
                    return None
                entries.append(f'"{key}": {code(a.value)}')
            elif key not in ("flatten", "device_type", "p2p_groups"):
                return None
        return entries or None

    def get_metadata_safe(self, node: cst.CSTNode):
        from libcst.metadata import QualifiedNameProvider

        try:
            return self.get_metadata(QualifiedNameProvider, node, set())
        except KeyError:
            return set()

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.Dict:
        for entry in self._dict_entries.get(id(original_node), ()):
            updated_node = with_entry(updated_node, entry)
        return updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        mesh = self._mesh_for.get(id(original_node))
        if mesh is not None:
            self.record(KIND_MPU)
            return updated_node.with_changes(keyword=cst.Name("mesh"), value=cst.Name(mesh))
        plan = self._from_mpu.get(id(original_node))
        if plan is None:
            return updated_node
        self.record(KIND_MPU)
        mesh_class = self.mesh_ref("DeepSpeedDeviceMesh")
        value = updated_node.value
        if plan[0] == "ifexp":
            assert isinstance(value, cst.IfExp)

            def wrap(b: cst.BaseExpression) -> cst.BaseExpression:
                return (
                    b
                    if isinstance(b, cst.Name) and b.value == "None"
                    else cst.parse_expression(f"{mesh_class}.from_mpu({code(b)})")
                )

            new = value.with_changes(body=wrap(value.body), orelse=wrap(value.orelse))
        elif plan[0] == "guard":
            new = cst.parse_expression(f"None if {code(value)} is None else {mesh_class}.from_mpu({code(value)})")
        else:
            new = cst.parse_expression(f"{mesh_class}.from_mpu({code(value)})")
        return updated_node.with_changes(keyword=cst.Name("mesh"), value=new)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        planned = self._call_drops.get(id(original_node))
        if planned is None:
            return updated_node
        drop_ids, kinds = planned
        for kind in kinds:
            self.record(kind)
        drops = [u for o, u in zip(original_node.args, updated_node.args) if id(o) in drop_ids]
        for arg in drops:  # the last argument's comma (and its comment) moves to the new last one
            self.keep_comments(arg.value if arg is updated_node.args[-1] else arg)
        return without_args(updated_node, drops)
