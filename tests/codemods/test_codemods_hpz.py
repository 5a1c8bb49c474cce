"""ZeRO++ hpZ helpers inside DeepSpeed (zero.Init, the ZeRO-3 optimizer, the engine) rewritten to
the mesh's ``create_hpz_group`` / ``hpz_group*`` methods.

Legacy side: the real deepspeed 0.19.8 on fake worlds, running copies of DeepSpeed's own hpZ code
(partition_parameters.py:1117-1134, stage3.py:267-273 and :753, engine.py:2717-2720). Migrated side:
the codemod's output of the same code run on the mesh runtime (compat installed) in the states
DeepSpeed reaches it: no engine yet (zero.Init before ``deepspeed.initialize``), while an engine
builds (its mesh bound and current), after it (its mesh the default). Same groups, sizes, ranks and
errors; the very group objects compat's legacy getters serve; no process group created by a read.
"""

from __future__ import annotations

import contextlib

import pytest
import torch.distributed as dist

from codemods import migrate_code
from fakepg import exec_source as _load
from fakepg import fake_world, plain, record_new_groups
from fakepg import probe_ranks as _ranks
from todo_lines import inline

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARTITION = '''
from deepspeed.utils import groups


def init_hpz(hpz, given=None):
    """zero.Init.__init__'s hpZ block (partition_parameters.py:1117-1134)."""
    zero_param_process_group = given
    if hpz > 1 and zero_param_process_group is None:
        groups._create_zero_param_parallel_group(hpz)
        zero_param_process_group = groups._get_zero_param_intra_parallel_group()
    out = [zero_param_process_group]
    if zero_param_process_group is not None:
        out.append(groups._get_zero_param_intra_parallel_group_world_size())
        out.append(groups._get_zero_param_intra_parallel_rank_in_mygroup())
        out.append("ranks {}".format(groups._get_zero_param_intra_parallel_group_ranks()))
    return out


def build(n):
    groups._create_zero_param_parallel_group(group_size=n)


def read():
    return [groups._get_zero_param_intra_parallel_group(),
            groups._get_zero_param_intra_parallel_group_world_size(),
            groups._get_zero_param_intra_parallel_rank_in_mygroup(),
            groups._get_zero_param_intra_parallel_group_ranks()]
'''

STAGE3 = """
from deepspeed.utils import groups


class DeepSpeedZeroOptimizer_Stage3:
    def __init__(self, zero_hpz_partition_size):
        self.zero_hpz_partition_size = zero_hpz_partition_size
        zero_param_parallel_group = groups._get_zero_param_intra_parallel_group()
        if self.zero_hpz_partition_size > 1 and zero_param_parallel_group is None:
            self._set_zero_group_parallelism()
            zero_param_parallel_group = groups._get_zero_param_intra_parallel_group()
        self.group = zero_param_parallel_group

    def _set_zero_group_parallelism(self):
        groups._create_zero_param_parallel_group(self.zero_hpz_partition_size)
"""

ENGINE = '''
from deepspeed.utils import groups


class DeepSpeedEngine:
    def __init__(self, hpz, mesh_device=None):
        self.hpz = hpz
        self.mesh_device = mesh_device

    def zero_hpz_partition_size(self):
        return self.hpz

    def offload_group(self):
        """engine.py:2717-2720 (ZeRO-Offload without an optimizer); _set_zero_group_parallelism is
        not defined on the engine in 0.19.8, so a build raises AttributeError there."""
        zero_param_parallel_group = groups._get_zero_param_intra_parallel_group()
        if self.zero_hpz_partition_size() > 1 and zero_param_parallel_group is None:
            self._set_zero_group_parallelism()
            zero_param_parallel_group = groups._get_zero_param_intra_parallel_group()
        return zero_param_parallel_group
'''

MODULES = {
    "partition": (PARTITION, "deepspeed.runtime.zero.partition_parameters"),
    "stage3": (STAGE3, "deepspeed.runtime.zero.stage3"),
    "engine": (ENGINE, "deepspeed.runtime.engine"),
}


def _migrate(which: str):
    source, module = MODULES[which]
    return migrate_code(source, module=module, package=module.rsplit(".", 1)[0])


class Probes:
    """One copy of the three DeepSpeed hpZ sites (legacy text or migrated)."""

    def __init__(self, migrated: bool) -> None:
        code = {k: _migrate(k).code if migrated else MODULES[k][0] for k in MODULES}
        partition = _load(code["partition"])
        self.init_hpz, self.build, self.read = partition["init_hpz"], partition["build"], partition["read"]
        self.Stage3 = _load(code["stage3"])["DeepSpeedZeroOptimizer_Stage3"]
        self.Engine = _load(code["engine"])["DeepSpeedEngine"]


def test_the_ten_deepspeed_sites_become_mesh_calls():
    part, stage3, engine = (_migrate(k) for k in ("partition", "stage3", "engine"))
    for out in (part, stage3, engine):
        assert "groups." not in out.code and "TODOV1" not in out.code and not out.todos, out.code
    assert "create_hpz_group(current_mesh(), hpz)" in part.code
    assert "create_hpz_group(current_mesh(), group_size=n)" not in part.code  # keyword form: value kept
    assert "create_hpz_group(current_mesh(), n)" in part.code
    assert "zero_param_process_group = hpz_group(current_mesh())" in part.code
    assert '"ranks {}".format(hpz_group_ranks(current_mesh()))' in part.code
    assert "hpz_group_size(current_mesh())" in part.code and "hpz_group_rank(current_mesh())" in part.code
    assert "create_hpz_group(current_mesh(), self.zero_hpz_partition_size)" in stage3.code
    assert stage3.code.count("hpz_group(current_mesh())") == 2
    assert engine.code.count("hpz_group(model_mesh(self))") == 2
    assert "self._set_zero_group_parallelism()" in engine.code  # legacy's AttributeError stays
    for which, out in zip(("partition", "stage3", "engine"), (part, stage3, engine)):  # idempotent
        module = MODULES[which][1]
        assert migrate_code(out.code, module=module, package=module.rsplit(".", 1)[0]).code == out.code
        compile(out.code, which, "exec")


@pytest.mark.parametrize(
    "source,needle",
    [
        ("x = groups._create_zero_param_parallel_group(2)\n", "returns None"),
        ("groups._create_zero_param_parallel_group()\n", "takes one argument"),
        ("groups._create_zero_param_parallel_group(2, 3)\n", "takes one argument"),
        ("g = groups._get_zero_param_intra_parallel_group(1)\n", "takes no arguments"),
    ],
)
def test_call_forms_without_an_exact_equivalent_stay_with_a_todo(source, needle):
    code = "from deepspeed.utils import groups\n" + source
    out = migrate_code(code, module="deepspeed.runtime.zero.stage3", package="deepspeed.runtime.zero")
    assert out.todos and needle in out.spelled_out() and not out.sites
    assert inline(out.code).splitlines()[1].split("  # TODOV1")[0] == source.strip()  # the call is left as it was


@pytest.mark.parametrize("module", ["train", "deepspeed.runtime.zero.utils", "deepspeed.moe.layer"])
def test_outside_the_verified_modules_a_read_stays_with_the_mesh_form_named(module):
    code = "from deepspeed.utils import groups\ng = groups._get_zero_param_intra_parallel_group()\n"
    out = migrate_code(code, module=module, package=module.rpartition(".")[0] or None)
    assert (
        out.todos
        and "hpz_group(<mesh>)" in out.spelled_out()
        and "torch.distributed is initialised" in out.spelled_out()
    )
    assert "g = groups._get_zero_param_intra_parallel_group()" in out.code
    assert migrate_code(out.code, module=module, package=module.rpartition(".")[0] or None).code == out.code


# --- legacy vs migrated on fake worlds -------------------------------------------------------------
WORLDS = (2, 4, 8, 16)


def _sizes(world: int) -> list[int]:
    return sorted({1, 2, 4, world, 2 * world})


def _outcome(fn, *args):
    try:
        return fn(*args)
    except AssertionError as exc:  # DeepSpeed's asserts; the mesh raises HpzGroupError, an AssertionError too
        return ("raises AssertionError", "already initialized" in str(exc))
    except Exception as exc:  # noqa: BLE001 (recorded and compared)
        return ("raises", type(exc).__name__)


class Side:
    """How one side enters an engine's build, leaves it, and releases the world's references."""

    def __init__(self, probes: Probes, groups, world: int, migrated: bool) -> None:
        self.p, self.groups, self.world, self.migrated = probes, groups, world, migrated
        self.mesh = None

    def new_engine_mesh(self):
        if not self.migrated:
            return None
        from compat.engine_mesh import as_engine_mesh
        from mesh_core import DeepSpeedDeviceMesh

        self.mesh = as_engine_mesh(DeepSpeedDeviceMesh.build(dp=self.world))  # a no-mpu engine's mesh
        return self.mesh

    @contextlib.contextmanager
    def building(self):
        """While ``deepspeed.initialize`` builds an engine (the shim binds its mesh and makes it current)."""
        mesh = self.new_engine_mesh()
        if mesh is None:
            yield None
            return
        from compat.engine_scope import GroupsState, groups_state

        with groups_state(GroupsState(mesh, None, None)):
            yield mesh

    def after(self) -> None:
        """After ``deepspeed.initialize`` returned: the engine's mesh bound and the default (settle)."""
        if self.migrated and self.mesh is not None:
            from compat.engine_scope import GroupsState, activate
            from mesh_core import set_default_mesh

            activate(GroupsState(self.mesh, None, None))
            set_default_mesh(self.mesh)

    def reset(self) -> None:
        if self.migrated:
            from compat.engine_scope import GroupsState, activate
            from mesh_core import set_default_mesh

            activate(GroupsState(None, None, None))
            set_default_mesh(None)

    def read(self) -> list:
        """The migrated reads create nothing and serve compat's very group object."""
        if not self.migrated:
            return self.p.read()
        with record_new_groups() as created:
            got = self.p.read()
        assert created == [], created
        assert got[0] is self.groups._get_zero_param_intra_parallel_group()
        assert got == [
            self.groups._get_zero_param_intra_parallel_group(),
            self.groups._get_zero_param_intra_parallel_group_world_size(),
            self.groups._get_zero_param_intra_parallel_rank_in_mygroup(),
            self.groups._get_zero_param_intra_parallel_group_ranks(),
        ]
        return got


def _init_then_engine(s: Side, n: int) -> list:
    out = [_outcome(s.p.init_hpz, n), s.read()]
    with s.building() as mesh:
        opt = s.p.Stage3(n)
        offload = s.p.Engine(n)
        out += [opt.group, _outcome(offload.offload_group), s.p.init_hpz(n, opt.group), s.read()]
    s.after()
    out += [s.read(), _outcome(s.p.Engine(n, mesh).offload_group)]
    return out


def _engine_only(s: Side, n: int) -> list:
    out = [s.read()]
    with s.building():
        opt = s.p.Stage3(n)
        out += [opt.group, s.p.init_hpz(n, opt.group), s.read()]  # parameter_offload's Init(group=...)
    s.after()
    return out + [s.read()]


def _repeated_engines(s: Side, n: int) -> list:
    out = []
    for _ in range(2):
        with s.building():
            out += [s.p.Stage3(n).group, s.read()]
        s.after()
    return out + [_outcome(s.p.init_hpz, n), s.read()]  # zero.Init builds unconditionally: asserts


def _offload_engine_first(s: Side, n: int) -> list:
    with s.building() as mesh:
        out = [_outcome(s.p.Engine(n).offload_group)]  # AttributeError when it must build (B1)
    s.after()
    return out + [_outcome(s.p.Engine(n, mesh).offload_group), s.read()]


def _given_group_only(s: Side, n: int) -> list:
    # a group passed in and none built: DeepSpeed reads the (absent) global one: world size / rank / []
    return [s.p.init_hpz(n, dist.group.WORLD), s.read(), _outcome(s.p.build, n), s.read(), _outcome(s.p.build, n)]


def _release(s: Side, n: int) -> list:
    with s.building():
        group = s.p.Stage3(n).group
    out = [group, s.read()]
    s.groups._release_process_group_references()  # deepspeed.comm.destroy_process_group()'s call
    s.reset()
    out.append(s.read())
    with s.building():
        group = s.p.Stage3(n).group
    s.after()
    out.append(s.read())
    if group is not None and dist.get_world_size(group) < s.world:  # (the mesh's world-wide group is WORLD)
        s.groups._release_process_group_references(group)  # a subgroup destroyed explicitly
        out.append(s.read())
    return out


SCENARIOS = {
    "init then engine": _init_then_engine,
    "engine only": _engine_only,
    "repeated engines": _repeated_engines,
    "offload engine first": _offload_engine_first,
    "given group only": _given_group_only,
    "release": _release,
}


def _run_side(migrated: bool, world: int, groups_module) -> dict:
    probes = Probes(migrated)
    out = {}
    for n in _sizes(world) + [3]:  # 3 divides none of the worlds: legacy asserts before any group
        for rank in _ranks(world):
            for name, scenario in SCENARIOS.items():
                with fake_world(rank, world, deepspeed_comm=True):
                    side = Side(probes, groups_module(), world, migrated)
                    try:
                        result = scenario(side, n)
                    except AssertionError:
                        if n != 3:
                            raise
                        result = "raises AssertionError"
                    finally:
                        side.reset()
                    out[(n, rank, name)] = plain(result)
    return out


def _legacy_groups():
    from deepspeed.utils import groups

    return groups


@pytest.mark.deepspeed
@pytest.mark.parametrize("world", WORLDS)
def test_migrated_hpz_sites_equal_legacy(world, monkeypatch):
    import deepspeed  # noqa: F401

    import compat.install as installer

    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = _run_side(False, world, _legacy_groups)
    assert any(v != legacy[next(iter(legacy))] for v in legacy.values())  # the scenarios differ at all
    installer.install()
    try:
        migrated = _run_side(True, world, _legacy_groups)
    finally:
        installer.uninstall()
    assert migrated.keys() == legacy.keys()
    for key in legacy:
        assert migrated[key] == legacy[key], key


@pytest.mark.deepspeed
def test_a_bad_size_creates_no_group_on_either_side(monkeypatch):
    import deepspeed  # noqa: F401

    import compat.install as installer
    from fakepg import group_count

    monkeypatch.setenv("LOCAL_RANK", "0")
    with fake_world(1, 8, deepspeed_comm=True):
        before = group_count()
        with pytest.raises(AssertionError, match="8 is not divisible by 3"):
            Probes(False).init_hpz(3)
        assert group_count() == before
    installer.install()
    try:
        from mesh_core.runtime_hooks import HpzGroupError

        probes = Probes(True)
        with fake_world(1, 8, deepspeed_comm=True), record_new_groups() as created:
            with pytest.raises(HpzGroupError, match=r"zero_hpz_partition_size=3 .*8 is not divisible by 3"):
                probes.init_hpz(3)
            assert created == [] and probes.read()[0] is None
    finally:
        installer.uninstall()


# --- the mesh API itself (no deepspeed): domains, sub-worlds, TP meshes ----------------------------
def test_meshes_of_one_domain_share_the_groups_and_others_have_their_own():
    from mesh_core import DeepSpeedDeviceMesh, current_mesh
    from mesh_core.runtime_hooks import HpzGroupError, release_hpz_groups

    with fake_world(5, 8):
        world = current_mesh()
        engine = DeepSpeedDeviceMesh.build(dp=8)
        tp = DeepSpeedDeviceMesh.build(dp=4, tp=2)
        assert (hpz_group(world), hpz_group_size(world), hpz_group_rank(world), hpz_group_ranks(world)) == (
            None,
            8,
            5,
            [],
        )
        with record_new_groups() as created:
            group = create_hpz_group(world, 4)
        assert created == [[4, 5, 6, 7]]  # member-only: this rank's block, nothing else
        assert hpz_group(engine) is group and hpz_group_ranks(engine) == [4, 5, 6, 7]
        assert (hpz_group_size(engine), hpz_group_rank(engine)) == (4, 1)
        with pytest.raises(AssertionError, match="already initialized"):
            create_hpz_group(engine, 2)
        # TP: blocks inside this rank's ZeRO group [1, 3, 5, 7], not the world block [4, 5]
        assert hpz_group(tp) is None
        assert dist.get_process_group_ranks(create_hpz_group(tp, 2)) == [5, 7]
        # a sub-world mesh groups its own ranks only
        sub = DeepSpeedDeviceMesh.build(dp=4, ranks=range(4, 8))
        assert sorted(dist.get_process_group_ranks(create_hpz_group(sub, 2))) == [4, 5]
        assert hpz_group_ranks(sub) == [4, 5] and hpz_group(world) is group
        with pytest.raises(HpzGroupError, match=r"zero_hpz_partition_size=0 must be a positive int"):
            create_hpz_group(DeepSpeedDeviceMesh.build(dp=2, tp=4), 0)
        assert release_hpz_groups(group) == 1  # one entry: the world mesh and the engine share a domain
        assert hpz_group(world) is None and hpz_group(engine) is None and hpz_group(tp) is not None
        release_hpz_groups()
        assert hpz_group(tp) is None and hpz_group(sub) is None


def test_hsdp_hpz_is_the_shard_group_and_must_match_its_size():
    from mesh_core import DeepSpeedDeviceMesh, MeshSpecError
    from mesh_core.runtime_hooks import HpzGroupError

    with fake_world(5, 8):
        mesh = DeepSpeedDeviceMesh.build(dp_replicate=2, dp_shard=4, order=["dp_shard", "dp_replicate"])
        with pytest.raises(MeshSpecError, match=r"does not match .* dp_shard x sp = 4"):
            create_hpz_group(mesh, 2)
        assert sorted(dist.get_process_group_ranks(create_hpz_group(mesh, 4))) == [1, 3, 5, 7]
        with pytest.raises(HpzGroupError):
            create_hpz_group(mesh, 4)


@pytest.mark.deepspeed
def test_with_a_tp_engine_the_migrated_sites_serve_what_the_shim_serves(monkeypatch):
    """With TP the shim cuts hpZ blocks inside each ZeRO (dp) group; legacy cut world blocks across TP
    lanes (and its engine reused zero.Init's). The migrated sites serve exactly the shim's groups."""
    import deepspeed  # noqa: F401

    import compat.install as installer
    from compat.engine_mesh import as_engine_mesh
    from compat.engine_scope import GroupsState, groups_state
    from mesh_core import DeepSpeedDeviceMesh

    monkeypatch.setenv("LOCAL_RANK", "0")
    installer.install()
    try:
        migrated, unmigrated = Probes(True), Probes(False)
        for rank, world_block, zero_block in ((0, [0, 1], [0, 2]), (5, [4, 5], [5, 7])):
            with fake_world(rank, 8, deepspeed_comm=True):
                mesh = as_engine_mesh(DeepSpeedDeviceMesh.build(dp=4, tp=2))
                init = migrated.init_hpz(2)  # before any engine: the world's blocks, as legacy
                assert plain(init) == [("group", world_block), 2, world_block.index(rank), f"ranks {world_block}"]
                with groups_state(GroupsState(mesh, None, None)):
                    with record_new_groups() as created:
                        group = migrated.Stage3(2).group
                    assert created == [zero_block]  # member-only: this rank's block only
                    served = unmigrated.read()
                    assert group is served[0] and migrated.read() == served
                    assert plain(served) == [("group", zero_block), 2, zero_block.index(rank), zero_block]
    finally:
        installer.uninstall()


# --- call shapes (hypothesis): import forms, argument forms, function / method, legacy vs migrated --
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mesh_core.runtime_hooks import (  # noqa: E402
    create_hpz_group,
    hpz_group,
    hpz_group_rank,
    hpz_group_ranks,
    hpz_group_size,
)

IMPORTS = {
    "module": ("from deepspeed.utils import groups", "groups.{}"),
    "alias": ("import deepspeed.utils.groups as G", "G.{}"),
    "dotted": ("import deepspeed", "deepspeed.utils.groups.{}"),
    "names": (
        "from deepspeed.utils.groups import (_create_zero_param_parallel_group as mk,\n"
        "    _get_zero_param_intra_parallel_group, _get_zero_param_intra_parallel_group_world_size as ws,\n"
        "    _get_zero_param_intra_parallel_rank_in_mygroup, _get_zero_param_intra_parallel_group_ranks)",
        None,
    ),
}
_NAMED = {"_create_zero_param_parallel_group": "mk", "_get_zero_param_intra_parallel_group_world_size": "ws"}


def _shape_source(form: str, keyword: bool, method: bool, guarded: bool) -> str:
    header, pattern = IMPORTS[form]

    def ref(name: str) -> str:
        return _NAMED.get(name, name) if pattern is None else pattern.format(name)

    size = "group_size=n" if keyword else "n"
    body = [
        f"{ref('_create_zero_param_parallel_group')}({size})",
        f"out = [{ref('_get_zero_param_intra_parallel_group')}()]",
        f"out.append({ref('_get_zero_param_intra_parallel_group_world_size')}())",
        f"out.append({ref('_get_zero_param_intra_parallel_rank_in_mygroup')}())",
        f"out.append(list({ref('_get_zero_param_intra_parallel_group_ranks')}()))",
        "return out",
    ]
    if guarded:  # DeepSpeed's form: build only when none exists
        body[0] = f"if {ref('_get_zero_param_intra_parallel_group')}() is None:\n        {body[0]}"
    indent = "        " if method else "    "
    lines = [indent + line.replace("\n    ", "\n" + indent) for line in body]
    if method:
        return header + "\n\n\nclass DeepSpeedZeroOptimizer_Stage3:\n    def run(self, n):\n" + "\n".join(lines) + "\n"
    return header + "\n\n\ndef run(n):\n" + "\n".join(lines) + "\n"


def _shape_run(source: str, method: bool, world: int, rank: int, n: int):
    namespace = _load(source)
    run = namespace["DeepSpeedZeroOptimizer_Stage3"]().run if method else namespace["run"]
    with fake_world(rank, world, deepspeed_comm=True):
        first = _outcome(run, n)
        return plain([first, _outcome(run, n)])  # the second build asserts unless guarded


@pytest.mark.deepspeed
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(sorted(IMPORTS)),
    keyword=st.booleans(),
    method=st.booleans(),
    guarded=st.booleans(),
    world=st.sampled_from(WORLDS),
    data=st.data(),
)
def test_call_shapes_migrate_to_code_that_computes_what_legacy_does(
    form, keyword, method, guarded, world, data, monkeypatch
):
    import deepspeed  # noqa: F401

    import compat.install as installer

    monkeypatch.setenv("LOCAL_RANK", "0")
    rank = data.draw(st.integers(0, world - 1), label="rank")
    n = data.draw(st.sampled_from(_sizes(world) + [3]), label="n")
    source = _shape_source(form, keyword, method, guarded)
    out = migrate_code(source, module="deepspeed.runtime.zero.stage3", package="deepspeed.runtime.zero")
    assert not out.todos and "_zero_param" not in out.code and out.sites["groups getter"] == 5 + guarded, out.code
    legacy = _shape_run(source, method, world, rank, n)
    installer.install()
    try:
        migrated = _shape_run(out.code, method, world, rank, n)
    finally:
        installer.uninstall()
    assert migrated == legacy, (source, out.code)
