"""DeepSpeed's process-wide expert state, served to every mesh (``mesh_core.runtime_hooks.serve_process_experts``).

Legacy ``deepspeed.utils.groups`` keeps one name-keyed expert table and one expert tensor-parallel
size per process. Under the shim that state lives in :mod:`compat.groups`; :class:`LegacyExperts`
is a live, read-only view of it, so migrated DeepSpeed code reading through whichever mesh is
current (an engine's, the default, the world mesh) reads exactly what the legacy getters read:
``expert_groups_named(current_mesh(), name)`` is ``_get_expert_parallel_group(name)``'s group, and
``mesh_core.runtime_hooks.expert_tensor_parallel_size()`` is ``_get_expert_model_parallel_world_size()``.
:func:`compat.install` serves it; :func:`compat.uninstall` stops.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from mesh_core import ExpertGroups


class _NamedView(Mapping):
    """``{name: ExpertGroups}`` over compat's legacy dicts, read on every access (the dicts are
    cleared and refilled in place, and ``compat.groups._state`` is replaced on a world release)."""

    @staticmethod
    def _state():
        from . import groups

        return groups._state

    def __getitem__(self, name: str) -> ExpertGroups:
        state = self._state()
        if name not in state.expert_parallel_group or name not in state.expert_data_parallel_group:
            raise KeyError(name)
        size = name[len("ep_size_") :] if isinstance(name, str) else ""
        return ExpertGroups(
            ep_size=int(size) if size.isdigit() else 0,
            ep_group=state.expert_parallel_group[name],
            edp_group=state.expert_data_parallel_group[name],
            ep_ranks=state.expert_parallel_group_ranks[name],
            edp_ranks=state.expert_data_parallel_group_ranks[name],
        )

    def __contains__(self, name: object) -> bool:
        state = self._state()
        return name in state.expert_parallel_group and name in state.expert_data_parallel_group

    def __iter__(self) -> Iterator[str]:
        state = self._state()
        return iter([n for n in state.expert_parallel_group if n in state.expert_data_parallel_group])

    def __len__(self) -> int:
        state = self._state()
        return sum(1 for n in state.expert_parallel_group if n in state.expert_data_parallel_group)


class LegacyExperts:
    """compat.groups' expert table and expert tensor-parallel size (a ``mesh_core.runtime_hooks.ProcessExperts``)."""

    def __init__(self) -> None:
        self._named = _NamedView()

    def named_expert_groups(self) -> Mapping[str, ExpertGroups]:
        return self._named

    def expert_tensor_parallel_size(self) -> int:
        from . import groups

        return groups.expert_tensor_parallel_world_size


def serve() -> None:
    from mesh_core.runtime_hooks import serve_process_experts

    serve_process_experts(LegacyExperts())


def stop() -> None:
    from mesh_core.runtime_hooks import process_experts, serve_process_experts

    if isinstance(process_experts(), LegacyExperts):
        serve_process_experts(None)
