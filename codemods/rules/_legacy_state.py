"""Process-wide legacy state as the unit of migration.

``deepspeed.utils.groups`` keeps state that one call builds and other calls read: the AutoTP groups
(``_init_tp_mesh_device``; read by the lettered getters ``get_tensor_model_parallel_group`` ... and
by DeepSpeed's engine, ZeRO and tensor-parallel code) and the name-keyed expert tables
(``_create_expert_and_data_parallel``; read by the expert getters and by DeepSpeed's MoE layers,
``CheckOverflow``, ``clip_grad_norm_`` and the engine). A mesh rewrite of a builder fills no legacy
table (with or without ``compat.install()``), so a builder moves only together with every reader of
its state, and a reader moves only where its builder does.

A file (outside DeepSpeed) holds a state at its legacy form when it builds it and

- a builder cannot be rewritten (its result is used, or it has options with no mesh form), or
- the file also uses DeepSpeed code beyond ``deepspeed.utils.groups`` / ``deepspeed.comm`` /
  ``deepspeed.accelerator`` (DeepSpeed's own readers), or
- no reader of it is in the file (its readers are in other modules).

Then the builder and this file's readers stay as they are, with one ``TODOV1`` at each builder naming
the readers that hold it back.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

import ds_mesh_advice

AUTOTP = "AutoTP groups"
EXPERTS = "expert groups"

BUILDERS: dict[str, frozenset] = {
    AUTOTP: frozenset({"_init_tp_mesh_device", "_init_tp_groups_with_new_group"}),
    EXPERTS: frozenset({"_create_expert_and_data_parallel", "_create_expert_data_and_model_parallel"}),
}
READERS: dict[str, frozenset] = {
    AUTOTP: frozenset(
        {
            "get_tensor_model_parallel_group",
            "get_model_parallel_group",
            "get_data_parallel_group",
            "get_tensor_model_parallel_world_size",
            "get_model_parallel_world_size",
            "get_tensor_model_parallel_rank",
            "get_model_parallel_rank",
            "get_tensor_model_parallel_src_rank",
            "get_data_parallel_world_size",
            "get_data_parallel_rank",
        }
    ),
    EXPERTS: frozenset(
        {
            "_get_expert_parallel_group",
            "_get_expert_parallel_group_ranks",
            "_get_expert_data_parallel_group",
            "_get_expert_data_parallel_group_ranks",
            "_get_expert_parallel_world_size",
            "_get_expert_data_parallel_world_size",
            "_get_expert_parallel_rank",
            "_get_expert_data_parallel_rank",
            "_get_expert_broadcast_src_rank",
            "_get_expert_parallel_src_rank",
            "_get_expert_parallel_group_dict",
            "_get_expert_data_parallel_group_dict",
            "_get_max_expert_size",
            "_get_max_expert_size_name",
            "_get_max_expert_parallel_group",
        }
    ),
}
# DeepSpeed modules and names that read none of these states
_NEUTRAL = (
    "deepspeed.utils.groups",
    "deepspeed.comm",
    "deepspeed.accelerator",
    "deepspeed.utils.logging",
    "deepspeed.runtime.pipe.topology",
    "deepspeed.init_distributed",
)

# TODOV1 texts, one place (kept short: a reader list, why, and what to write: the catalog's next step)
KEPT = "groups.{fname} kept{readers}: {why}"
NEXT_STEP = {
    AUTOTP: ds_mesh_advice.row("deepspeed.utils.groups._init_tp_mesh_device").next_step,
    EXPERTS: ds_mesh_advice.row("deepspeed.utils.groups._create_expert_and_data_parallel").next_step,
}
WHY = {
    "internal": "the DeepSpeed code this file uses ({modules}) may read the legacy {state}, which have no mesh form "
    "while it does; to move: {next}",
    "elsewhere": "its readers are in other modules or DeepSpeed; to move it with them: {next}",
    "builder": "{builder_why}; to move it and its readers together: {next}",
    "builder elsewhere": "the legacy {state} they read are built in another module or by DeepSpeed; "
    "to move them with their builder: {next}",
}
# readers that stay legacy in a file that does not build their state (none today: with no default
# mesh, current_mesh() answers the AutoTP "tp" / "dp" from the legacy AutoTP groups built in another
# module, and the expert groups from the legacy tables when an mpu is recorded, else over the data
# ranks as legacy builds them without one; mesh_core.roles.legacy_state)
READERS_WITHOUT_BUILDER: dict = {}


@dataclass
class Holding:
    """A legacy state this file keeps: why, and the readers (``(name, line)``) it keeps with it."""

    state: str
    why: str
    readers: list = field(default_factory=list)
    at_reader: bool = False  # no builder here: the TODOV1 goes at the first reader
    names: Optional[frozenset] = None  # the readers it holds (None: every reader of the state)
    flagged: bool = False

    def holds(self, fname: str) -> bool:
        return self.names is None or fname in self.names

    def message(self, fname: str) -> str:
        why = self.why
        if fname in BUILDERS[self.state]:  # a builder's own next step (the shim's warning for it says the same)
            why = why.replace(NEXT_STEP[self.state], ds_mesh_advice.row(f"deepspeed.utils.groups.{fname}").next_step)
        lines: dict[str, list] = {}
        for name, line in self.readers:
            lines.setdefault(name, []).append(str(line))
        shown = [f"{name}:{at[0]}" + (f"(+{len(at) - 1})" if len(at) > 1 else "") for name, at in lines.items()]
        readers = " with " + ", ".join(shown) if shown else ""  # each reader named (a bounded set of getters)
        if self.at_reader:
            return KEPT.format(
                fname=fname, readers=" (and this file's other readers)" if len(self.readers) > 1 else "", why=why
            )
        return KEPT.format(fname=fname, readers=readers, why=why)


def _neutral(module: str) -> bool:
    return module == "deepspeed.utils" or any(module == n or module.startswith(n + ".") for n in _NEUTRAL)


def deepspeed_users(tree: ast.AST) -> list[str]:
    """The DeepSpeed modules and names (other than the state-neutral ones) this module imports or
    reaches through ``deepspeed.<attr>``: DeepSpeed code that may read legacy state."""
    found: list[str] = []
    plain: set[str] = set()  # names bound to the deepspeed package itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "deepspeed":
                    continue
                if alias.asname is None or alias.name == "deepspeed":
                    plain.add(alias.asname or "deepspeed")
                elif not _neutral(alias.name):
                    found.append(alias.name)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and not node.level
            and node.module.split(".")[0] == "deepspeed"
        ):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if not (_neutral(node.module) or _neutral(full)):
                    found.append(full)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in plain
            and not _neutral(f"deepspeed.{node.attr}")
        ):
            found.append(f"deepspeed.{node.attr}")
    return list(dict.fromkeys(found))


def holdings(
    builders: dict[str, list[tuple[str, bool]]],
    readers: dict[str, list[str]],
    users: list[str],
) -> dict[str, Holding]:
    """The states this file keeps: ``builders[state]`` is ``(why a builder cannot move, or "", ...)``
    per builder call, ``readers[state]`` this file's readers (``(name, line)``), ``users`` what
    :func:`deepspeed_users` found."""
    held: dict[str, Holding] = {}
    for state, names in READERS_WITHOUT_BUILDER.items():
        found = [r for r in readers.get(state, []) if r[0] in names]
        if found and not builders.get(state):
            held[state] = Holding(
                state,
                WHY["builder elsewhere"].format(state=state, next=NEXT_STEP[state]),
                found,
                at_reader=True,
                names=names,
            )
    for state, calls in builders.items():
        if not calls:
            continue
        found = readers.get(state, [])
        stuck = next((why for why, _ in calls if why), "")
        if users:
            shown = ", ".join(users[:2]) + (", ..." if len(users) > 2 else "")
            why = WHY["internal"].format(modules=shown, state=state, next=NEXT_STEP[state])
        elif stuck:
            why = WHY["builder"].format(builder_why=stuck, next=NEXT_STEP[state])
        elif not found:
            why = WHY["elsewhere"].format(next=NEXT_STEP[state])
        else:
            continue
        held[state] = Holding(state, why, found)
    return held


def state_of_reader(fname: str) -> Optional[str]:
    return next((state for state, names in READERS.items() if fname in names), None)


def state_of_builder(fname: str) -> Optional[str]:
    return next((state for state, names in BUILDERS.items() if fname in names), None)
