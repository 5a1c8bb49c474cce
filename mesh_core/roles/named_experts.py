"""Expert groups by the names DeepSpeed's MoE layers use (``"ep_size_N"``), read through a mesh.

A mesh keeps its named expert groups in its own table (``mesh.experts``, a
:class:`~mesh_core.expert_table.ExpertTable`: each size :meth:`~mesh_core.DeepSpeedDeviceMesh.expert_groups`
builds is registered as ``ep_size_<N>``); a runtime that serves a process-wide table (:mod:`mesh_core.roles.process_experts`)
is read first. These functions are DeepSpeed's name-keyed getters on a mesh
(``groups._get_expert_parallel_group(name)`` → ``expert_groups_named(mesh, name).ep_group``); import
them from :mod:`mesh_core.runtime_hooks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional

from .process_experts import process_expert_groups

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from ..expert_table import ExpertGroups

PREFIX = "ep_size_"

__all__ = [
    "expert_group_names",
    "expert_groups_named",
    "largest_expert_groups_name",
    "named_expert_data_parallel_groups",
    "named_expert_parallel_groups",
    "register_expert_groups",
]


class _NamedGroupsView(Mapping):
    """A live read-only ``{name: groups.<attr>}`` view of a mesh's named expert groups."""

    def __init__(self, named: Callable[[], Mapping[str, "ExpertGroups"]], attr: str) -> None:
        self._named, self._attr = named, attr

    def __getitem__(self, name: str) -> Optional["ProcessGroup"]:
        return getattr(self._named()[name], self._attr)

    def __iter__(self) -> Iterator[str]:
        return iter(self._named())

    def __len__(self) -> int:
        return len(self._named())


def _not_built(message: str) -> Exception:
    from ..expert_table import ExpertGroupsNotBuilt

    return ExpertGroupsNotBuilt(message)


def named_table(mesh: Any) -> Mapping[str, "ExpertGroups"]:
    """The names ``mesh`` serves: those a runtime serves per process (DeepSpeed's one name-keyed
    table, whichever mesh reads it), then the groups this mesh built itself; without a runtime
    source, every name registered on the mesh."""
    served = process_expert_groups()
    if served is None:
        return mesh.experts.named()
    own = {n: g for n, g in mesh.experts.built_named().items() if n not in served}
    return {**served, **own} if own else served


def register_expert_groups(mesh: Any, name: str, groups: "ExpertGroups") -> "ExpertGroups":
    """Serve ``groups`` under ``name`` on ``mesh`` (the first registration of a name wins, as
    DeepSpeed's builders skip a name that exists); returns what ``name`` serves. Creates nothing."""
    from ..spec import MeshSpecError

    if not isinstance(name, str) or not name:
        raise MeshSpecError(f"an expert group name is a non-empty string like 'ep_size_4', got {name!r}")
    return mesh.experts.register(name, groups)


def named_expert_parallel_groups(mesh: Any) -> Mapping[str, Optional["ProcessGroup"]]:
    """A live read-only view ``{name: this rank's EP group}`` of the mesh's named expert groups."""
    return _NamedGroupsView(lambda: named_table(mesh), "ep_group")


def named_expert_data_parallel_groups(mesh: Any) -> Mapping[str, Optional["ProcessGroup"]]:
    """A live read-only view ``{name: this rank's EDP group}`` of the mesh's named expert groups."""
    return _NamedGroupsView(lambda: named_table(mesh), "edp_group")


def expert_groups_named(mesh: Any, name: str) -> "ExpertGroups":
    """The expert groups ``mesh`` serves under ``name`` (a runtime's process-wide table first);
    creates nothing, raises :class:`~mesh_core.runtime_hooks.ExpertGroupsNotBuilt` (naming the
    registered names) if there are none."""
    served = process_expert_groups()
    try:
        if served is not None and name in served:  # the hot path: one lookup in the process table
            return served[name]
        return named_table(mesh)[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(named_table(mesh))) or "none"
        raise _not_built(
            f"no expert groups named {name!r} on {mesh.spec.describe()} (registered: {known}); build them with "
            "mesh.expert_groups(N) or a MoE layer first"
        ) from None


def expert_group_names(mesh: Any) -> list[str]:
    """The names expert groups are registered under on ``mesh``, in registration order."""
    return list(named_table(mesh))


def largest_expert_groups_name(mesh: Any) -> str:
    """``ep_size_<N>`` for the largest N registered (DeepSpeed's ``_get_max_expert_size_name``:
    ``ep_size_None`` when there is none)."""
    sizes = [int(n[len(PREFIX) :]) for n in named_table(mesh) if n.startswith(PREFIX) and n[len(PREFIX) :].isdigit()]
    return f"{PREFIX}{max(sizes) if sizes else None}"
