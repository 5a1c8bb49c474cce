"""Codemod: ``deepspeed.utils.groups`` getters (lettered and underscore) → calls on the model's mesh.

``groups.get_data_parallel_group()`` becomes ``<mesh>.get_group("dp")``, where ``<mesh>`` is
``self.mesh_device`` inside an engine subclass, ``<engine>.mesh_device`` after
``<engine>, ... = deepspeed.initialize(...)`` in the same scope, else ``current_mesh()``.
"""

from __future__ import annotations

import ast
from typing import Optional

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

import ds_mesh_advice

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand, arg_by, fill_hooks, find_all, has_star_args
from . import _autotp as autotp
from . import _expert_grid as expert_grid
from . import _expert_process as expert_process
from . import _hpz as hpz
from . import _legacy_state as ls
from . import _mpu_exact as mpu_exact
from ._expert_grid import expert_size

KIND = "groups getter"

_GROUPS = "deepspeed.utils.groups."
_MESH_ROWS = [r for r in ds_mesh_advice.rows() if r.section == "groups" and r.mesh]
# legacy function -> replacement template ({mesh}: the model's mesh), the catalog's mesh expression;
# calls take no arguments.
SIMPLE: dict[str, str] = {r.name[len(_GROUPS) :]: r.template() for r in _MESH_ROWS if "(N)" not in r.mesh}
# legacy function taking an expert group name "ep_size_N" -> template ({n}: N).
EXPERT: dict[str, str] = {r.name[len(_GROUPS) :]: r.template() for r in _MESH_ROWS if "(N)" in r.mesh}

# Inside DeepSpeed's engine-scoped modules (ENGINE_SCOPED_MODULES) the expert getters read the
# name-keyed groups the MoE layers / the engine built; the model's mesh serves that table by name
# (the mesh runtime mirrors every legacy expert builder into it), so any name expression is exact.
_NAMED = "{expert_groups_named}({mesh}, {name})"
NAMED_EXPERT: dict[str, str] = {
    "_get_expert_parallel_group": _NAMED + ".ep_group",
    "_get_expert_parallel_group_ranks": _NAMED + ".ep_ranks",
    "_get_expert_data_parallel_group": _NAMED + ".edp_group",
    "_get_expert_data_parallel_group_ranks": _NAMED + ".edp_ranks",
    "_get_expert_parallel_world_size": "torch.distributed.get_world_size(" + _NAMED + ".ep_group)",
    "_get_expert_data_parallel_world_size": "torch.distributed.get_world_size(" + _NAMED + ".edp_group)",
    "_get_expert_parallel_rank": "torch.distributed.get_rank(" + _NAMED + ".ep_group)",
    "_get_expert_data_parallel_rank": "torch.distributed.get_rank(" + _NAMED + ".edp_group)",
    "_get_expert_broadcast_src_rank": "torch.distributed.get_global_rank(" + _NAMED + ".edp_group, 0)",
}
NAMED_NO_ARGS: dict[str, str] = {
    "_get_expert_parallel_group_dict": "{named_expert_parallel_groups}({mesh})",
    "_get_expert_data_parallel_group_dict": "{named_expert_data_parallel_groups}({mesh})",
    "_get_max_expert_size_name": "{largest_expert_groups_name}({mesh})",
    "_get_max_expert_parallel_group": "{expert_groups_named}({mesh}, {largest_expert_groups_name}({mesh})).ep_group",
}

# process-wide legacy state the mesh runtime serves to every mesh (codemods/rules/_expert_process.py);
# rewritten inside DeepSpeed's package only (migrated user code may run without compat's source)
PROCESS: dict[str, str] = {
    "_get_expert_model_parallel_world_size": "{expert_tp}()",
}

# legacy function -> what a human must do (left unchanged with a TODOV1 comment): the replacement the one
# advice table gives (ds_mesh_advice; the shim's warnings and MIGRATION.md say the same).
_MANUAL_NAMES = (
    "initialize",
    "set_tensor_model_parallel_world_size",
    "set_tensor_model_parallel_rank",
    "_get_model_parallel_world_size",
    "_get_expert_parallel_group_dict",
    "_get_expert_data_parallel_group_dict",
    "_get_max_expert_size",
    "_get_max_expert_size_name",
    "_get_max_expert_parallel_group",
    "_get_expert_model_parallel_world_size",
    "_create_expert_data_and_model_parallel",
    "_get_expert_parallel_ranks",
    "_create_model_parallel",
    "_get_local_all_to_all_group",
    "_zero_param_parallel_is_initialized",
    "_ensure_divisibility",
    "_release_process_group_references",
    "_init_tp_groups_with_new_group",
    "_init_tp_mesh_device",
    "_create_expert_and_data_parallel",
)
MANUAL: dict[str, str] = {name: "use " + ds_mesh_advice.plain(_GROUPS + name) for name in _MANUAL_NAMES}
INIT_TP = ("_init_tp_mesh_device", "_init_tp_groups_with_new_group")


def _referenced_advice(fname: str) -> str:
    """What to pass where a getter is handed on uncalled: a function of the model's mesh."""
    template = SIMPLE.get(fname)
    if template is not None:
        return "pass (lambda: " + template.format(mesh="<mesh>") + ")"
    try:
        return "call the model's mesh instead: " + ds_mesh_advice.row(_GROUPS + fname).next_step
    except KeyError:
        return "call <mesh>.get_group / .size / .get_local_rank(<dim>) instead"


STATE = {"mpu", "mesh_device", "expert_tensor_parallel_world_size"}
WORLD = "torch.distributed.group.WORLD"  # _clone_world_group(): the default group spans the world
EXPERT_MANUAL = frozenset(n for n in MANUAL if "expert" in n) - {"_create_expert_and_data_parallel"}
EXPERT_RELATED = frozenset(EXPERT) | EXPERT_MANUAL | {"_create_expert_and_data_parallel"}
# calls after which the mesh a file runs on may have TP / SP (a default mesh, an engine's mesh)
TP_SOURCES = frozenset(INIT_TP) | {"initialize", "set_default_mesh", "use_mesh"}
_PLANNING_NAMES = EXPERT_RELATED | TP_SOURCES
_READER_NAMES = frozenset().union(*ls.READERS.values())
# pre-0.6 ``deepspeed.utils.groups`` names that DeepSpeed 0.19.8 no longer has (calling one raises
# AttributeError there) -> what 0.19.8 has instead (their catalog rows); a call is flagged, naming it
PRE_06_NOTES = "pre-0.6 name"
PRE_06: dict[str, str] = {
    r.name[len(_GROUPS) :]: r.advice
    for r in ds_mesh_advice.rows()
    if r.section == "groups" and r.notes.startswith(PRE_06_NOTES)
}

ALL_FUNCTIONS = (
    frozenset(SIMPLE)
    | frozenset(EXPERT)
    | frozenset(MANUAL)
    | frozenset(PROCESS)
    | {"_clone_world_group"}
    | hpz.FUNCTIONS
)

# Inside DeepSpeed's own package a getter reads the groups state of the engine being built or
# stepped. The mesh runtime makes that engine's mesh current (mesh_core.use_mesh) while it builds
# and around its entry points, so these modules, whose group reads run only there (engine, pipeline
# engine, the ZeRO / BF16 optimizers it builds and steps), read it as ``model_mesh(self)`` inside
# an engine and ``current_mesh()`` elsewhere. Anywhere else in DeepSpeed a read may run before any
# engine exists (AutoTP, MoE layers, tp_model_init, utilities), where legacy answers from state the
# mesh does not hold (the AutoTP mesh, the world): those sites are left with a TODOV1.
ENGINE_SCOPED_MODULES = frozenset(
    {
        "deepspeed.runtime.engine",
        "deepspeed.runtime.pipe.engine",
        "deepspeed.runtime.zero.stage_1_and_2",
        "deepspeed.runtime.zero.stage3",
        "deepspeed.runtime.bf16_optimizer",
        "deepspeed.runtime.base_optimizer",  # the ZeRO optimizers' base: its reads run in their steps / checkpoints
    }
)
_OUTSIDE_ENGINE = (
    "this DeepSpeed module may run before any engine exists (or outside one), where legacy groups answer "
    "from the AutoTP / mpu / world state rather than an engine's mesh: pass the model's mesh in and call {call}"
)


def in_deepspeed(module: Optional[str]) -> bool:
    return bool(module) and (module == "deepspeed" or module.startswith("deepspeed."))


def _star_exports(module: str) -> frozenset:
    """The legacy names ``from <module> import *`` binds (public names; the re-exports of
    ``deepspeed.utils``)."""
    if module == ln.GROUPS:
        return frozenset(n for n in ALL_FUNCTIONS | STATE if not n.startswith("_"))
    if module == "deepspeed.utils":
        return ln.GROUPS_STAR_EXPORTS
    return frozenset()


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


class GroupsGettersCommand(MigrationCommand):
    DESCRIPTION = "deepspeed.utils.groups getters -> calls on the model's DeepSpeedDeviceMesh"
    IDENTIFIERS = (ALL_FUNCTIONS | STATE | frozenset(PRE_06) | {"getattr"},)
    MARKERS = (
        (
            "utils.groups",
            "import groups",
            "groups import",
            "deepspeed.utils import",
            "deepspeed.utils.get_",
            "deepspeed.utils._get_",
            "from deepspeed import utils",
            "from compat",
            "import compat",
            "groups._",
            "groups.get_",
        ),
    )

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        self._module_node = node
        result = super().visit_Module(node)
        all_calls = find_all(node, cst.Call)
        self._calls = [c for c in all_calls if self.could_be(c.func, _PLANNING_NAMES)]
        self._reader_calls = [c for c in all_calls if self.could_be(c.func, _READER_NAMES)]
        self._deferred = self._defers_experts()
        self._expert_grid = expert_grid.ExpertGrid(self, EXPERT, NAMED_EXPERT, NAMED_NO_ARGS, EXPERT_MANUAL)
        self._experts_blocked = self._expert_blocker(node)
        self._builds_autotp = any(self._sets_tp_mesh(c) for c in self._calls)
        self._mpu_assigned = self._groups_mpu_assignment(node)
        self._held = {} if in_deepspeed(self.context.full_module_name) else self._held_states(node)
        return result

    def _defers_experts(self) -> bool:
        """This file's expert sites move onto the grid's mesh together, or stay together
        (codemods/rules/_expert_grid.py): outside DeepSpeed, a file that calls the expert-TP builder
        (``_create_expert_data_and_model_parallel``)."""
        if in_deepspeed(self.context.full_module_name):
            return False
        return any(self.function_of(c.func) == "_create_expert_data_and_model_parallel" for c in self._calls)

    def _held_here(self, fname: str) -> bool:
        """``groups.<fname>`` belongs to a legacy state this file keeps whole (flagged as such below)."""
        holding = self._held.get(ls.state_of_reader(fname))
        return ls.state_of_builder(fname) in self._held or (holding is not None and holding.holds(fname))

    def may_keep_alone(self, call: cst.Call) -> bool:
        fname = self.function_of(call.func)
        state = ls.state_of_reader(fname) if fname is not None else None
        if state is None or state in self._held:
            return True
        # a reader whose builder this file moves moves with it (the planning above decided so)
        return not any(ls.state_of_builder(self.function_of(c.func) or "") == state for c in self._calls)

    def _held_states(self, module: cst.Module) -> dict:
        """The process-wide legacy states this file keeps with their readers (codemods.rules._legacy_state)."""
        builders: dict[str, list] = {}
        for call in self._calls:
            fname = self.function_of(call.func)
            state = ls.state_of_builder(fname) if fname else None
            if state is not None:
                stuck = self._builder_stuck(call, fname)
                builders.setdefault(state, []).append((f"{stuck} (line {self.line_of(call)})" if stuck else "", call))
        readers: dict[str, list] = {}
        for call in self._reader_calls:
            fname = self.function_of(call.func)
            state = ls.state_of_reader(fname) if fname else None
            if state is not None:
                readers.setdefault(state, []).append((fname, self.line_of(call)))
        if not builders and not any(readers.get(state) for state in ls.READERS_WITHOUT_BUILDER):  # the common case
            return {}
        try:
            users = ls.deepspeed_users(ast.parse(module.code))
        except (SyntaxError, ValueError):
            users = ["unparsable"]
        return ls.holdings(builders, readers, users)

    def _builder_stuck(self, call: cst.Call, fname: str) -> str:
        """Why this builder call has no mesh rewrite ("": it has one)."""
        if self._deferred and fname == expert_grid.BUILDER:
            return expert_grid.builder_stuck(self, call)
        if not isinstance(self.parent(call), cst.Expr):
            return "its result is used"
        if has_star_args(call):
            return "it takes *args"
        if fname in INIT_TP:
            tp = arg_by(call, 0, "tensor_model_parallel_size")
            dp = arg_by(call, 1, "data_parallel_size")
            return "" if len(call.args) == (tp is not None) + (dp is not None) else "it has other arguments"
        if fname == "_create_expert_and_data_parallel":
            ep = arg_by(call, 0, "expert_parallel_size_")
            return (
                ""
                if ep is not None and len(call.args) == 1
                else "its options (mp_size, pp_size, data-before-expert) have no mesh form"
            )
        return "expert-TP groups have no mesh form here"

    def _groups_mpu_assignment(self, module: cst.Module) -> Optional[tuple[str, int]]:
        """(value code, line) of the first ``groups.mpu = <value>`` (value not None) in this file."""
        for assign in find_all(module, cst.Assign):
            if isinstance(assign.value, cst.Name) and assign.value.value == "None":
                continue
            for target in assign.targets:
                node = target.target
                if (
                    isinstance(node, cst.Attribute)
                    and node.attr.value == "mpu"
                    and ln.GROUPS in self.legacy_names(node.value)
                ):
                    return code(assign.value), self.line_of(assign)
        return None

    def _expert_blocker(self, module: cst.Module) -> Optional[str]:
        """Why no expert site of this file may be rewritten (None: all may).

        Legacy expert groups live in one name-keyed table that the builder fills and the getters
        read, so a file's expert sites move to the mesh together or not at all (a getter on the mesh
        after a legacy builder, or the reverse, would read groups nobody built). And a builder
        called without ``mp_size`` ignores TP and SP (consecutive EP ranks over the world, per pipe
        stage): the mesh's ``expert_groups(N)`` agrees only while the mesh the file runs on has no
        TP / SP, which a file that builds AutoTP groups or an engine cannot promise. A file with
        expert-TP builders over a grid: :meth:`codemods.rules._expert_grid.ExpertGrid.blocker`."""
        if self._deferred:
            return self._expert_grid.blocker(module, EXPERT_RELATED)
        calls = [c for c in self._calls if self.could_be(c.func, EXPERT_RELATED)]
        served_by_name = expert_process.named_reads_here(self.context.full_module_name)
        for call in calls:
            fname = self.function_of(call.func)
            if fname is None:
                continue
            if served_by_name and (fname in NAMED_EXPERT or fname in NAMED_NO_ARGS):
                continue  # read from the legacy table by name (expert_process), whoever built it
            caught = self._caught_legacy_exception(call)
            if caught is not None:  # kept there (MigrationCommand), so every expert site is
                return f"groups.{fname} is inside try/except {caught} (code may wait for the legacy exception)"
            if has_star_args(call):
                return f"groups.{fname}(*args)"
            if fname in EXPERT and expert_size(call) is None:
                return f"groups.{fname} with an expert-group name that is not a literal 'ep_size_N'"
            if fname in EXPERT_MANUAL:
                return f"groups.{fname} has no mesh equivalent"
            if fname == "_create_expert_and_data_parallel":
                ep = arg_by(call, 0, "expert_parallel_size_")
                if ep is None or len(call.args) != 1 or not isinstance(self.parent(call), cst.Expr):
                    return "the expert groups are built with options (mp_size, pp_size, data-before-expert) or their result is used"
        if any(self._sets_tp_mesh(c) or self.could_be(c.func, TP_SOURCES - frozenset(INIT_TP)) for c in self._calls):
            return (
                "this file also builds TP groups or an engine, and legacy expert groups built without mp_size ignore "
                "TP/SP while <mesh>.expert_groups(N) splits the data ranks of each TP lane"
            )
        return None

    def function_of(self, node: cst.CSTNode) -> Optional[str]:
        if not self.could_be(node, ALL_FUNCTIONS):
            return None  # cheap pre-check before resolving the qualified name
        name = self.legacy_name(node, lambda n: ln.groups_function(n) is not None)
        return ln.groups_function(name) if name else None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self._is_dynamic_getattr(original_node):
            self.flag(
                KIND,
                "dynamic getattr on deepspeed.utils.groups; call <mesh>.get_group / .size / .get_local_rank(<dim>)",
            )
            return updated_node
        fname = self.function_of(original_node.func)
        if fname is None and self._groups_parameter_is_module(original_node.func):
            fname = original_node.func.attr.value  # type: ignore[attr-defined]
        if fname is None and self._on_groups_parameter(original_node.func):
            self.flag(
                KIND,
                f"{code(original_node.func)}: a parameter named groups (DeepSpeed passes deepspeed.utils.groups "
                "in) cannot be followed statically; pass the model's mesh instead and call it (ds-migrate --explain groups)",
            )
            return updated_node
        if fname is None and self.could_be(original_node.func, PRE_06):
            old = self.legacy_name(original_node.func, lambda n: ln.groups_function(n) in PRE_06)
            if old is not None:
                old = ln.groups_function(old)
                self.flag(
                    KIND,
                    f"groups.{old}() is a pre-0.6 name that DeepSpeed 0.19.8 does not have (AttributeError "
                    f"there): write {PRE_06[old]}, then migrate again",
                )
            return updated_node
        if fname is None or fname not in ALL_FUNCTIONS:
            return updated_node
        if self._deferred and fname in EXPERT_RELATED and not self._held_here(fname):
            if self._experts_blocked:  # all kept together (codemods/rules/_expert_grid.py)
                self.flag(
                    KIND,
                    f"groups.{fname} kept (all expert sites of this file are): {self._experts_blocked}; "
                    f"to move them together: {expert_grid.NEXT_STEP}",
                )
                return updated_node
            return self._expert_grid.moved(original_node, updated_node, fname)
        if has_star_args(original_node):
            self.flag(KIND, f"groups.{fname}(*args) cannot be rewritten safely; spell the arguments out, then rerun")
            return updated_node
        if self._held:  # a legacy state kept whole: its builder flagged once, its readers as they are
            state = ls.state_of_builder(fname)
            if state in self._held:
                self.flag(KIND, self._held[state].message(fname))
                return updated_node
            holding = self._held.get(ls.state_of_reader(fname))
            if holding is not None and holding.holds(fname):
                if holding.at_reader and not holding.flagged:
                    holding.flagged = True
                    self.flag(KIND, holding.message(fname))
                return updated_node
        if fname in hpz.FUNCTIONS:  # ZeRO++ hpZ helpers: codemods/rules/_hpz.py
            return hpz.rewrite(self, original_node, updated_node, fname)
        if autotp.applies(self, original_node, fname):  # AutoTP inside DeepSpeed
            return autotp.rewrite(self, original_node, updated_node, fname)
        if fname in mpu_exact.GROUPS_CALLS:  # the engine's mpu, the node all-to-all groups
            replacement = mpu_exact.groups_call(self, original_node, fname)
            if replacement is not None:
                return self._replace(original_node, replacement)
        if fname in SIMPLE and not original_node.args:
            if self.outside_engine():
                call = SIMPLE[fname].format(mesh="<mesh>")
                self.flag(KIND, f"groups.{fname}: " + _OUTSIDE_ENGINE.format(call=call))
                return updated_node
            if (
                fname.startswith("_")
                and self._mpu_assigned is not None
                and not in_deepspeed(self.context.full_module_name)
            ):
                value, line = self._mpu_assigned
                call = SIMPLE[fname].format(mesh=f"mesh_of({value})")
                self.flag(
                    KIND,
                    f"groups.{fname} kept: this module sets groups.mpu = {value} (line {line}), whose groups legacy "
                    "answers (a grid: its stage's), while current_mesh() with no default mesh is the world's "
                    f"data-parallel mesh: call {call} (mesh_core.mesh_of) where that mpu is in scope",
                )
                return updated_node
            if fname.startswith("_") and self._builds_autotp:
                self.flag(
                    KIND,
                    f"groups.{fname} reads the mpu / mesh_param state, not the AutoTP groups this file builds "
                    "(with neither, legacy answers for the whole world): use <mesh> of the engine, or "
                    "torch.distributed.group.WORLD for the world",
                )
                return updated_node
            return self.rewrite(original_node, SIMPLE[fname])
        if fname == "_clone_world_group" and not original_node.args:
            AddImportsVisitor.add_needed_import(self.context, "torch.distributed")
            return self._replace(original_node, WORLD)
        if fname in PROCESS and not original_node.args and in_deepspeed(self.context.full_module_name):
            return self._replace(
                original_node, PROCESS[fname].format(expert_tp=self.mesh_ref("expert_tensor_parallel_size"))
            )
        named_here = self.engine_scoped() or expert_process.named_reads_here(self.context.full_module_name)
        if (fname in NAMED_EXPERT or fname in NAMED_NO_ARGS) and named_here:
            named = self._named_expert(original_node, updated_node, fname)
            if named is not None:
                return named
        if fname in EXPERT_RELATED and fname not in EXPERT_MANUAL and self._experts_blocked:
            if expert_process.named_reads_here(self.context.full_module_name):
                self.flag(
                    KIND,
                    f"groups.{fname} kept: {self._experts_blocked}; the legacy named groups it builds are "
                    "what expert_groups_named(<mesh>, name) serves (ds-migrate --explain groups)",
                )
                return updated_node
            self.flag(
                KIND,
                f"groups.{fname} kept (all expert sites of this file are): {self._experts_blocked}; "
                'to move them together: use "mesh": {"ep": N} and <mesh>.expert_groups(N)',
            )
            return updated_node
        if fname in EXPERT and self.outside_engine():
            self.flag(
                KIND, f"groups.{fname}: " + _OUTSIDE_ENGINE.format(call=EXPERT[fname].format(mesh="<mesh>", n="N"))
            )
            return updated_node
        if fname in EXPERT:
            size = expert_size(original_node)
            if size is None:
                self.flag(
                    KIND, f"groups.{fname}: pass the ep size N literally ('ep_size_N'), or use <mesh>.expert_groups(N)"
                )
                return updated_node
            return self.rewrite(original_node, EXPERT[fname], n=code(size))
        replacement = None if self.outside_engine(also_scoped=True) else self._statement_call(original_node, fname)
        if replacement is not None:
            self.record(KIND)
            return cst.parse_expression(replacement)
        self.flag(KIND, f"groups.{fname}: {MANUAL.get(fname, 'ds-migrate --explain groups')}")
        return updated_node

    def engine_scoped(self) -> bool:
        module = self.context.full_module_name
        return in_deepspeed(module) and module in ENGINE_SCOPED_MODULES

    def _named_expert(self, call: cst.Call, updated: cst.Call, fname: str) -> Optional[cst.BaseExpression]:
        """An expert getter read from the model's mesh by group name (None: the call's form has no
        exact equivalent, e.g. extra arguments). The name is taken from ``updated`` (its own legacy
        calls already rewritten)."""
        if fname in NAMED_NO_ARGS:
            return self.rewrite(call, NAMED_NO_ARGS[fname]) if not call.args else None
        arg = arg_by(updated, 0, "group_name")
        if arg is None or len(updated.args) != 1:
            return None
        if "torch.distributed" in NAMED_EXPERT[fname]:
            AddImportsVisitor.add_needed_import(self.context, "torch.distributed")
        return self.rewrite(call, NAMED_EXPERT[fname], name=code(arg.value))

    def outside_engine(self, also_scoped: bool = False) -> bool:
        """This file is part of DeepSpeed and its reads may run outside an engine's scope (with
        ``also_scoped``: any DeepSpeed module, for builders that must stay legacy there)."""
        module = self.context.full_module_name
        if not in_deepspeed(module):
            return False
        return also_scoped or module not in ENGINE_SCOPED_MODULES

    def model_mesh(self, node: cst.CSTNode) -> cst.BaseExpression:
        """Inside DeepSpeed: ``model_mesh(self)`` in an engine (its ``mesh_device`` is None until
        ``deepspeed.initialize`` returns), else ``current_mesh()``; see ENGINE_SCOPED_MODULES."""
        if not in_deepspeed(self.context.full_module_name):
            return super().model_mesh(node)
        owner = self.engine_owner(node)
        if owner is not None:
            return cst.parse_expression(f"{self.mesh_ref('model_mesh')}({owner})")
        return cst.Call(func=cst.parse_expression(self.mesh_ref("current_mesh")))

    def _groups_parameter_is_module(self, func: cst.BaseExpression) -> bool:
        """``func`` is ``groups.<legacy function>`` on the ``groups`` parameter of a function that every
        caller in DeepSpeed hands deepspeed.utils.groups (codemods/expert_process.GROUPS_PARAMETERS)."""
        if not self._on_groups_parameter(func):
            return False
        scope = self.scope_of(func.value)  # type: ignore[attr-defined]
        node = getattr(scope, "node", None)
        name = node.name.value if isinstance(node, cst.FunctionDef) else None
        if len(scope.assignments["groups"]) != 1:  # the parameter, never rebound
            return False
        return expert_process.groups_parameter_function(self.context.full_module_name, name)

    def _on_groups_parameter(self, func: cst.BaseExpression) -> bool:
        """``func`` is ``groups.<legacy function>`` where ``groups`` is a function parameter (flagged,
        never rewritten: what is passed in is unknown). ``groups.mpu.get_*()`` is the mpu codemods'."""
        if not isinstance(func, cst.Attribute) or func.attr.value not in ALL_FUNCTIONS:
            return False
        receiver = func.value
        if not (isinstance(receiver, cst.Name) and receiver.value == "groups"):
            return False
        scope = self.scope_of(receiver)
        if scope is None:
            return False
        return any(isinstance(getattr(a, "node", None), cst.Param) for a in scope.assignments["groups"])

    def _replace(self, call: cst.Call, replacement: str) -> cst.BaseExpression:
        """``replacement`` (code) for the legacy ``call``, its comments kept, counted as a site."""
        self.keep_comments(call)
        self.record(KIND)
        return cst.parse_expression(replacement)

    def rewrite(self, call: cst.Call, template: str, **parts: str) -> cst.BaseExpression:
        new = self._replace(call, fill_hooks(template, self.mesh_ref, mesh=code(self.model_mesh(call)), **parts))
        return new.with_changes(lpar=call.lpar, rpar=call.rpar) if call.lpar else new

    def _statement_call(self, call: cst.Call, fname: str) -> Optional[str]:
        """Replacement code for a builder whose result is unused (a bare expression statement):
        ``groups._init_tp_mesh_device(N)`` → ``set_default_mesh(DeepSpeedDeviceMesh.build(tp=N))``,
        ``groups._create_expert_and_data_parallel(N)`` → ``<mesh>.expert_groups(N)``."""
        parent = self.parent(call)
        if not isinstance(parent, cst.Expr) or has_star_args(call):
            return None
        if fname in INIT_TP:
            tp = arg_by(call, 0, "tensor_model_parallel_size")
            dp = arg_by(call, 1, "data_parallel_size")
            if len(call.args) != (tp is not None) + (dp is not None):
                return None
            sizes = [f"tp={code(tp.value) if tp is not None else '1'}"]
            if dp is not None and not (isinstance(dp.value, cst.Name) and dp.value.value == "None"):
                sizes.insert(0, f"dp={code(dp.value)}")
            setter, mesh_class = self.mesh_ref("set_default_mesh"), self.mesh_ref("DeepSpeedDeviceMesh")
            return f"{setter}({mesh_class}.build({', '.join(sizes)}))"
        if fname == "_create_expert_and_data_parallel":
            ep = arg_by(call, 0, "expert_parallel_size_")
            if ep is None or len(call.args) != 1:
                return None
            return f"{code(self.model_mesh(call))}.expert_groups({code(ep.value)})"
        return None

    def _sets_tp_mesh(self, call: cst.Call) -> bool:
        """``call`` builds AutoTP groups (``_init_tp_mesh_device(N)``, N not a literal 1) or sets a
        default mesh (what the first rewrites to, so that a second run decides the same)."""
        if self.could_be(call.func, {"set_default_mesh", "use_mesh"}):
            return True
        if not (self.could_be(call.func, INIT_TP) and self.function_of(call.func) in INIT_TP):
            return False
        tp = arg_by(call, 0, "tensor_model_parallel_size")
        return not (tp is not None and isinstance(tp.value, cst.Integer) and tp.value.value == "1")

    # --- star imports: the names they bind cannot be resolved --------------------------------
    def visit_ImportFrom(self, node: cst.ImportFrom) -> Optional[bool]:
        if not isinstance(node.names, cst.ImportStar) or node.module is None:
            return True
        module = ln.absolute("." * len(node.relative) + code(node.module), self.context.full_package_name)
        exported = _star_exports(ln.canonical(module)) if module else frozenset()
        used = sorted(exported & self._loaded_names())
        if used:
            self.flag(KIND, f"star import of {module}: import {', '.join(used)} by name, then rerun the codemod")
        return False

    def _loaded_names(self) -> set[str]:
        """Bare names the module uses (not attribute or keyword names)."""
        module = self._module_node
        skipped = {id(a.attr) for a in find_all(module, cst.Attribute)}
        skipped |= {id(a.keyword) for a in find_all(module, cst.Arg) if a.keyword is not None}
        return {n.value for n in find_all(module, cst.Name) if id(n) not in skipped}

    # --- references that are not calls -------------------------------------------------------
    def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
        self._check_reference(node)
        return True

    def visit_Name(self, node: cst.Name) -> Optional[bool]:
        self._check_reference(node)
        return True

    def _check_reference(self, node: cst.BaseExpression) -> None:
        if not self.could_be(node, ALL_FUNCTIONS | STATE):
            return
        parent = self.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            return
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # the outer attribute is the reference
        if isinstance(parent, (cst.ImportAlias, cst.AsName, cst.ImportFrom)):
            return
        for name in self.legacy_names(node):
            fname = ln.groups_function(name)
            if fname in ALL_FUNCTIONS:
                self.flag(KIND, f"groups.{fname} is referenced, not called; {_referenced_advice(fname)}")
                return
            if fname in STATE:
                self.flag(KIND, f"groups.{fname} is legacy module state; use the model's mesh (engine.mesh_device)")
                return

    def _is_dynamic_getattr(self, call: cst.Call) -> bool:
        if not (isinstance(call.func, cst.Name) and call.func.value == "getattr" and call.args):
            return False
        return ln.GROUPS in self.legacy_names(call.args[0].value)
