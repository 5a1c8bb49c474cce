"""``DeepSpeedDeviceMesh``: one model's process groups, on top of torch's ``DeviceMesh``.

The mesh creates the groups of every declared dim of size > 1 and hands them to torch's
``DeviceMesh`` (``DeviceMesh.from_group``), so DTensor / FSDP2 see an ordinary DeviceMesh that
holds exactly these groups. It adds what DeviceMesh lacks: flattened groups over several dims
(e.g. ``("dp", "sp")`` for ZeRO), expert-parallel (``ep``) and expert-data-parallel (``edp``)
groups, pipeline p2p groups between adjacent stages, and sharing: a rank set that already has a
communicator in this world (from this mesh or another) is reused, never created twice.

Creation is member-only (see :mod:`mesh_core.registry` for why the group names agree): a rank
creates only the groups it belongs to, one call per group, so a mesh costs each rank O(number of
dims) calls whatever the world size, and ranks outside a sub-world mesh never take part in it —
they need not construct it at all (if they do, nothing is called and :attr:`is_member` is False).
DeviceMesh does not create the groups itself: its ``__init__`` loops over every group of every dim
on every rank (counter-named ``new_group``), which is the O(world) cost removed here and would
force non-members into a sub-world mesh.

Every *member* builds the mesh with the same spec, and requests lazily created groups
(:meth:`ensure_group` / :meth:`get_group` of a not-yet-built combination, :meth:`expert_groups`
of a new size), in the same program order; for a non-member these return None without a call.
The constructor requests this rank's groups in this fixed order (a global order on groups that
every member follows, so the blocking rendezvous of overlapping groups cannot deadlock):

1. the DeviceMesh dims of size > 1, outermost first;
2. ``dp`` of an HSDP mesh (``dp_replicate`` × ``dp_shard``), then each ``flatten`` entry in order;
3. when ``ep > 1``: the EP group, then the EDP group;
4. when ``p2p_groups=True`` and ``pp > 1``: this rank's p2p pairs, in ascending order of the pair.

Where the registry's typed rule picks ``split_group`` (NCCL-style backends bound to a device, whole
world mesh), steps 1–3 are one collective ``split_group`` per partition on every rank instead —
inside the constructor only, where every world rank is. Groups requested afterwards (a flattened
dim, a dim of size 1, expert groups of a new size), and partitions into one-rank groups, are
member-only on every world, so a request made by some ranks only never needs the others.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterable, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from . import torch_compat
from .consistency import check_same_mesh, rank_set_slot
from .expert_table import ExpertGroups, ExpertGroupsNotBuilt, ExpertTable, expert_groups_name  # noqa: F401 (re-exported)
from .layout import Dims, MeshLayout
from .registry import CreationInputs, CreationPath, GroupRegistry, Key, choose_creation_path, registry_for_world
from .renamed import TorchGetRank, warn_renamed
from .spec import MeshSpec, MeshSpecError

logger = logging.getLogger(__name__)


# old attribute -> (what to write instead, its value now)
_RENAMED_ATTRIBUTES = {
    "expert_names": ("mesh.experts.named()", ExpertTable.named),
    "built_expert_groups": ("mesh.experts.sizes()", ExpertTable.sizes),
}


class DeepSpeedDeviceMesh(TorchGetRank):
    """Process groups for one model's layout; see the module docstring for the creation order.

    Its methods mean what torch ``DeviceMesh``'s of the same name mean (``get_rank()`` is the global
    rank, ``get_local_rank(dim)`` the index along a dim, ``size()`` every rank; docs/API.md).

    Threads: meshes may be built, used and destroyed from several threads. Process state stays
    consistent (group naming touches torch's ``_process_group_name`` only for the calling thread and
    puts it back; a bound device is hidden from the creating thread only; the registry's bookkeeping
    is locked). Construction is *not* serialized per process, so threads whose meshes wait on each
    other's peers cannot deadlock (see :mod:`mesh_core.registry`, "Threads"). What c10d requires
    across ranks still holds: every member issues its creations and releases of a rank set in the
    same order. Hence:

    - meshes over different rank sets (e.g. a pair mesh in one thread, a column mesh in another)
      can be built and destroyed concurrently; a rank set both request is created once and shared
      (a whole-world build's split children excepted: they are never shared with member-only
      requests, so thread timing cannot decide which kind a rank set gets);
    - one thread at a time builds a mesh over a given rank set (the whole world included): a second
      thread that tries meanwhile gets :class:`~mesh_core.consistency.ConcurrentCheckError` at once;
      built one after the other from different threads, their order must be the same on every rank
      (or the consistency check reports a disagreement);
    - destroying a mesh whose groups another thread's mesh shares, while that thread requests them
      again, has no defined order across ranks: fix it by the program (one thread, or a join).
    """

    def __init__(
        self,
        spec: MeshSpec,
        *,
        device_type: Optional[str] = None,
        backend: Optional[str] = None,
        flatten: Sequence[Sequence[str]] = (),
        p2p_groups: bool = False,
        verify: bool = True,
    ) -> None:
        torch_compat.check_torch()
        if not dist.is_available() or not dist.is_initialized():
            raise MeshSpecError(
                "torch.distributed is not initialised; call torch.distributed.init_process_group "
                "(or deepspeed.init_distributed) before building a DeepSpeedDeviceMesh"
            )
        if spec.world_size != dist.get_world_size():
            raise MeshSpecError(
                f"the spec was built for world_size={spec.world_size}, but torch.distributed has "
                f"world_size={dist.get_world_size()}"
            )
        self.spec = spec
        self.layout = MeshLayout(spec)
        self.device_type = device_type or torch_compat.default_device_type()
        self.backend = backend
        self.rank = dist.get_rank()
        self.is_member = self.layout.contains(self.rank)
        flatten_keys = [self.layout.normalize(d) for d in flatten]  # validate before creating anything
        # one thread of this process at a time builds a mesh over these ranks (see the class docstring)
        with rank_set_slot(spec) if self.is_member else contextlib.nullcontext():
            if verify and self.is_member:  # members that disagree would hang creating groups
                check_same_mesh(spec, flatten=flatten_keys, p2p_groups=p2p_groups, backend=backend)
            self._build(flatten_keys, p2p_groups)

    def _build(self, flatten_keys: list[tuple[str, ...]], p2p_groups: bool) -> None:
        spec, backend = self.spec, self.backend
        self.registry: GroupRegistry = registry_for_world()  # the world's (shared by its meshes)
        self.creation_path = choose_creation_path(
            CreationInputs.probe(backend, whole_world=spec.size == spec.world_size)
        )
        self._label = spec.describe()
        self._keys: list = []
        self._groups: dict[tuple[str, ...], Optional[ProcessGroup]] = {}
        # expert groups built per ep size, and by the name DeepSpeed's MoE layers use
        self.experts = ExpertTable()
        self._p2p: Optional[dict[tuple[int, int], Optional[ProcessGroup]]] = None
        self._destroyed = False
        self.source_mpu: Any = None  # the mpu from_mpu built this mesh from (None otherwise)

        self.mesh_dim_names = tuple(n for n, s in zip(spec.names, spec.sizes) if s > 1) or spec.names[:1]
        self._in_lockstep = True  # every rank of the mesh is in this constructor, in the same order
        try:
            self.device_mesh: Optional[DeviceMesh] = self._build_device_mesh()
            if "dp" not in spec.names and all(spec.dim_size(d) > 1 for d in ("dp_replicate", "dp_shard")):
                self._ensure_group(self.layout.normalize("dp"))
            for dims in flatten_keys:
                self._ensure_group(dims)
            if spec.ep > 1:
                self.experts.add_built(spec.ep, self._build_expert_groups(self.layout))
        finally:
            self._in_lockstep = False
        if p2p_groups and spec.dim_size("pp") > 1:
            self._build_p2p_groups()
        if spec.size == spec.world_size:  # every world rank is here, in the same order: a connect point
            self.registry.connect(self._keys)
        logger.debug("built %s on rank %d", spec.describe(), self.rank)

    @classmethod
    def build(
        cls,
        *,
        device_type: Optional[str] = None,
        backend: Optional[str] = None,
        flatten: Sequence[Sequence[str]] = (),
        p2p_groups: bool = False,
        verify: bool = True,
        ranks: Optional[Iterable[int]] = None,
        order: Optional[Sequence[str]] = None,
        ep: int = 1,
        data_before_expert: bool = False,
        **sizes: Any,
    ) -> "DeepSpeedDeviceMesh":
        """Build a spec over the current world (or ``ranks``) and the mesh for it.

        ``device_type`` (every constructor): None follows the world (:func:`mesh_core.torch_compat.default_device_type`:
        the bound device's type, cuda under NCCL, cpu under gloo)."""
        torch_compat.check_torch()
        if not dist.is_available() or not dist.is_initialized():
            raise MeshSpecError("torch.distributed is not initialised; initialise it before building a mesh")
        spec = MeshSpec.build(
            dist.get_world_size(), ranks=ranks, order=order, ep=ep, data_before_expert=data_before_expert, **sizes
        )
        return cls(
            spec, device_type=device_type, backend=backend, flatten=flatten, p2p_groups=p2p_groups, verify=verify
        )

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        num_stages: Optional[int] = None,
        ep_size: Optional[int] = None,
        device_type: Optional[str] = None,
        backend: Optional[str] = None,
        flatten: Sequence[Sequence[str]] = (),
        p2p_groups: bool = False,
        verify: bool = True,
    ) -> "DeepSpeedDeviceMesh":
        """Build the mesh a DeepSpeed config describes (``"mesh"`` section or legacy keys)."""
        from .config import spec_from_config

        torch_compat.check_torch()
        if not dist.is_available() or not dist.is_initialized():
            raise MeshSpecError("torch.distributed is not initialised; initialise it before building a mesh")
        spec = spec_from_config(config, dist.get_world_size(), num_stages=num_stages, ep_size=ep_size)
        return cls(
            spec, device_type=device_type, backend=backend, flatten=flatten, p2p_groups=p2p_groups, verify=verify
        )

    @classmethod
    def from_groups(
        cls, *, device_type: Optional[str] = None, check_agreement: bool = True, **groups: Any
    ) -> "DeepSpeedDeviceMesh":
        """A mesh whose ``dp`` / ``tp`` / ``pp`` / ``sp`` groups are the given ones (this rank's
        ``ProcessGroup`` or its rank list per dim); collective. See :func:`mesh_core.roles.from_groups.from_groups`."""
        from .roles.from_groups import from_groups

        return from_groups(cls, device_type=device_type, check_agreement=check_agreement, **groups)

    @classmethod
    def from_mpu(
        cls, mpu: Any, *, device_type: Optional[str] = None, check_agreement: bool = True
    ) -> "DeepSpeedDeviceMesh":
        """A mesh reproducing ``mpu``'s groups (Megatron ``parallel_state``, a ``PipelineParallelGrid``,
        any object with the mpu getters); collective. See :func:`mesh_core.roles.from_groups.from_mpu`."""
        from .roles.from_groups import from_mpu

        return from_mpu(cls, mpu, device_type=device_type, check_agreement=check_agreement)

    # --- queries ------------------------------------------------------------------------------
    def get_group(self, dims: Dims) -> ProcessGroup:
        """This rank's group along ``dims`` (a dim, ``ep``/``edp``, or a tuple to flatten).

        Every member of the mesh calls it the first time a combination outside the DeviceMesh
        dims is asked for (it creates this rank's group then).
        """
        group = self.ensure_group(dims)
        if group is None:
            raise MeshSpecError(f"rank {self.rank} is not a member of {self.spec.describe()}")
        return group

    def ensure_group(self, dims: Dims) -> Optional[ProcessGroup]:
        """This rank's group along ``dims``, created on first request (every member of the mesh
        requests it in the same order); None outside the mesh, where nothing is called."""
        self._check_alive()
        key = self.layout.normalize(dims)
        if key in (("ep",), ("edp",)):
            groups = self.expert_groups()
            return groups.ep_group if key == ("ep",) else groups.edp_group
        return self._ensure_group(key)

    def get_group_ranks(self, dims: Dims, rank: Optional[int] = None) -> list[int]:
        """Global ranks of ``rank``'s (default: this rank's) group along ``dims``."""
        return self.layout.group_ranks(dims, self.rank if rank is None else rank)

    def get_all_group_ranks(self, dims: Dims) -> list[list[int]]:
        return self.layout.groups(dims)

    def get_local_rank(self, mesh_dim: Optional[Union[Dims, int]] = None) -> int:
        """This rank's index inside its group along ``mesh_dim`` (a dim, its index in
        :attr:`mesh_dim_names`, or a tuple of dims, flattened), as torch ``DeviceMesh.get_local_rank``;
        ``None`` only when the mesh has one dim."""
        return self.layout.coordinate_of(self.rank, self._mesh_dims(mesh_dim))

    def size(self, mesh_dim: Optional[Union[Dims, int]] = None) -> int:
        """Number of ranks in a group along ``mesh_dim`` (as :meth:`get_local_rank` names it); with
        no dim, every rank of the mesh (as torch ``DeviceMesh.size()``)."""
        if mesh_dim is None:
            return self.spec.size
        key = self.layout.normalize(self._mesh_dims(mesh_dim))
        if key in (("ep",), ("edp",)):
            return self.spec.dim_size(key[0])
        out = 1
        for name in key:
            out *= self.spec.dim_size(name)
        return out

    def stage_to_global(self, stage_id: int, **coords: int) -> int:
        """Global rank of this rank's coordinate with ``pp`` set to ``stage_id`` (and ``coords``)."""
        coord = self.layout.coordinate(self.rank)
        coord.update(coords, pp=stage_id)
        return self.layout.rank_at(**coord)

    def p2p_pair(self, rank: Optional[int] = None) -> list[int]:
        """``[rank, next-stage rank]``, wrapping from the last stage to the first."""
        return self.layout.p2p_pair(self.rank if rank is None else rank)

    def p2p_group(self, peer: int) -> Optional[ProcessGroup]:
        """The communicator for this rank and an adjacent-stage ``peer`` (``p2p_groups=True``)."""
        if self._p2p is None:
            raise MeshSpecError("this mesh was built without p2p groups; pass p2p_groups=True")
        return self._p2p.get(tuple(sorted((self.rank, peer))))  # type: ignore[arg-type]

    def expert_groups(self, ep_size: Optional[int] = None) -> ExpertGroups:
        """EP/EDP groups of ``ep_size`` (default: the spec's ep); every member of the mesh calls
        it the first time a size is asked for (this rank's two groups are created then)."""
        self._check_alive()
        ep = self.spec.ep if ep_size is None else ep_size
        groups = self.experts.built(ep)
        if groups is None:
            try:
                spec = MeshSpec.build(
                    self.spec.world_size,
                    ranks=self.spec.ranks,
                    order=self.spec.names,
                    ep=ep,
                    data_before_expert=self.spec.data_before_expert,
                    **self.spec.shape,
                )
            except MeshSpecError as err:
                raise MeshSpecError(f"ep_size={ep} is not valid for {self.spec.describe()}: {err}") from None
            groups = self._build_expert_groups(MeshLayout(spec))
            self.experts.add_built(ep, groups)
        return groups

    def destroy(self) -> int:
        """Release every group this mesh holds; groups no other mesh shares are destroyed."""
        if self._destroyed:
            return 0
        self._destroyed = True
        destroyed = self.registry.release(self._keys)
        self._keys.clear()
        self._groups.clear()
        self.experts.clear()
        self.device_mesh = None
        return destroyed

    def __getitem__(self, dims: Dims) -> DeviceMesh:
        """The torch DeviceMesh slice over DeviceMesh dims (for DTensor / FSDP2)."""
        if self.device_mesh is None:
            raise MeshSpecError(f"rank {self.rank} has no DeviceMesh for {self.spec.describe()}")
        return self.device_mesh[dims]

    def __repr__(self) -> str:
        return f"DeepSpeedDeviceMesh({self.spec.describe()})"

    def __getattr__(self, name: str) -> Any:
        """The old attribute spellings (read-only views now, with a one-time deprecation)."""
        if name in _RENAMED_ATTRIBUTES and "experts" in vars(self):
            new, read = _RENAMED_ATTRIBUTES[name]
            warn_renamed(f"DeepSpeedDeviceMesh.{name}", new, "the mesh's expert table owns them")
            return read(self.experts)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # --- construction -------------------------------------------------------------------------
    def _build_device_mesh(self) -> Optional[DeviceMesh]:
        names = self.mesh_dim_names
        groups = [self._create((n,), self.layout) for n in names]
        if not self.is_member:
            return None
        ranks = self.spec.ranks
        if isinstance(ranks, range):
            flat = torch.arange(ranks.start, ranks.stop, dtype=torch.int)
        else:
            flat = torch.tensor(ranks, dtype=torch.int)
        mesh_tensor = flat.reshape([self.spec.dim_size(n) for n in names])
        return DeviceMesh.from_group(groups, self.device_type, mesh=mesh_tensor, mesh_dim_names=names)

    def _ensure_group(self, key: tuple[str, ...]) -> Optional[ProcessGroup]:
        """This rank's group along normalised dims ``key``, created if needed."""
        if key in self._groups:
            return self._groups[key]
        if len(key) == 1 and key[0] in self.mesh_dim_names and self.device_mesh is not None:
            return self.device_mesh.get_group(key[0])
        group = self._groups[key] = self._create(key, self.layout) if key else self._singleton()
        return group

    def _create(self, key: tuple[str, ...], layout: MeshLayout) -> Optional[ProcessGroup]:
        """This rank's group along ``key`` of ``layout``: one split per partition while the mesh is
        being built on the split path (every world rank is there), member-only otherwise — groups
        asked for later, possibly by some ranks only, and partitions into one-rank groups."""
        asker = f"{self._label} dims={'x'.join(key)}"
        partition = layout.groups(key) if self.creation_path is CreationPath.SPLIT and self._in_lockstep else None
        if partition is not None and len(partition[0]) > 1:
            group, keys = self.registry.split(partition, asker=asker)
        elif not self.is_member:
            return None
        else:
            ranks = layout.group_ranks(key, self.rank)
            group, keys = self.registry.get(ranks, self.backend, asker=asker), [self.registry.key(ranks, self.backend)]
        self._keys += keys
        return group

    def _singleton(self) -> Optional[ProcessGroup]:
        if not self.is_member:
            return None
        self._keys.append(self.registry.key([self.rank], self.backend))
        return self.registry.get([self.rank], self.backend, asker=f"{self._label} dims=()")

    def _build_expert_groups(self, layout: MeshLayout) -> ExpertGroups:
        ep_group = self._create(("ep",), layout)
        edp_group = self._create(("edp",), layout)
        mine = self.is_member
        return ExpertGroups(
            ep_size=layout.spec.ep,
            ep_group=ep_group,
            edp_group=edp_group,
            ep_ranks=layout.group_ranks("ep", self.rank) if mine else [],
            edp_ranks=layout.group_ranks("edp", self.rank) if mine else [],
            layout=layout,
        )

    def _build_p2p_groups(self) -> None:
        self._p2p = {}
        if not self.is_member:
            return
        pairs = {tuple(sorted(self.layout.p2p_pair(self.rank))), tuple(sorted(self.layout.p2p_pair(self._prev())))}
        for key in sorted(p for p in pairs if p[0] != p[1]):  # ascending: a global order, no deadlock
            self._keys.append(self.registry.key(key, self.backend))
            self._p2p[key] = self.registry.get(key, self.backend, asker=f"{self._label} p2p")  # type: ignore[index]

    def _prev(self) -> int:
        return self.layout.stage_peer(self.rank, -1)

    def _mesh_dims(self, mesh_dim: Optional[Union[Dims, int]]) -> Dims:
        """Dims named as torch's ``mesh_dim`` may be: a name, a tuple, an index, or None for a 1-D mesh."""
        if mesh_dim is None:
            if len(self.mesh_dim_names) != 1:
                raise MeshSpecError(f"name the mesh dim: {self.spec.describe()} has dims {list(self.mesh_dim_names)}")
            return self.mesh_dim_names[0]
        if isinstance(mesh_dim, int) and not isinstance(mesh_dim, bool):
            if not 0 <= mesh_dim < len(self.mesh_dim_names):
                raise MeshSpecError(
                    f"mesh_dim={mesh_dim} is out of range; valid indices: 0..{len(self.mesh_dim_names) - 1} "
                    f"({list(self.mesh_dim_names)})"
                )
            return self.mesh_dim_names[mesh_dim]
        return mesh_dim

    def _check_alive(self) -> None:
        if self._destroyed:
            raise MeshSpecError(f"{self!r} was destroyed")

    def _communicators(self) -> "_Communicators":
        """This mesh's communicator bookkeeping, as releasing and resuming them
        (:mod:`mesh_core.step_aside`) reads and changes it."""
        return _Communicators(self)


class _Communicators:
    """A view of one mesh's communicator bookkeeping for :mod:`mesh_core.step_aside`: what it holds
    (read-only), and the one change a release makes to it, a dim answered by a stand-in while its
    group is released (undone on resume)."""

    __slots__ = ("_mesh",)

    def __init__(self, mesh: DeepSpeedDeviceMesh) -> None:
        self._mesh = mesh

    def check_alive(self) -> None:
        """Raise if the mesh was destroyed."""
        self._mesh._check_alive()

    @property
    def usable(self) -> bool:
        """This rank is a member and the mesh is not destroyed."""
        return self._mesh.is_member and not self._mesh._destroyed

    @property
    def keys(self) -> tuple[Key, ...]:
        """The rank sets the mesh holds a communicator for, in creation order (repeats kept)."""
        return tuple(self._mesh._keys)

    @property
    def dims(self) -> tuple[tuple[str, ...], ...]:
        """The dims (combinations included) the mesh keeps a group of its own for."""
        return tuple(self._mesh._groups)

    @property
    def p2p_pairs(self) -> tuple[tuple[int, int], ...]:
        """This rank's pipeline p2p pairs (none when built without them)."""
        return tuple(self._mesh._p2p or ())

    def serve(self, dims: tuple[str, ...], standin: Any) -> bool:
        """Answer ``dims`` with ``standin`` while released, unless the mesh keeps a group of its own for them."""
        groups = self._mesh._groups
        if dims in groups:
            return False
        groups[dims] = standin
        return True

    def unserve(self, dims: tuple[str, ...]) -> None:
        """Undo :meth:`serve`."""
        self._mesh._groups.pop(dims, None)
