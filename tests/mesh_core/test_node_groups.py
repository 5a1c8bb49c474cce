"""``groups._get_local_all_to_all_group()`` in DeepSpeed's engine (ZeRO++ qgZ), rewritten to
``mesh_core.runtime_hooks.local_all_to_all_groups(get_accelerator().device_count())`` (issue 10m). Legacy: the real
deepspeed 0.19.8 on fake worlds and devices-per-node counts; migrated: the codemod's output on the mesh
runtime. Same names and rank sets (non-members get ``NON_GROUP_MEMBER``), the same legacy assertion, the
very dict and groups compat's legacy getter hands out, nothing created when asked again, and a released
group leaves the dict the engine holds, as in legacy."""

from __future__ import annotations

import importlib

import pytest

from codemods import migrate_code
from fakepg import fake_world, plain, record_new_groups

pytestmark = [pytest.mark.deepspeed, pytest.mark.filterwarnings("ignore::Warning"), pytest.mark.torch_releases]

PROBE = """
from deepspeed.accelerator import get_accelerator
from deepspeed.utils import groups


class DeepSpeedEngine:
    def build(self):
        self.local_all_to_all_group = groups._get_local_all_to_all_group()
        return self.local_all_to_all_group
"""
MODULE = "deepspeed.runtime.engine"
# (world, devices per node): smaller than a node, one node, one node of another size (legacy asserts), 2-4 nodes
CASES = [(4, 8), (4, 4), (6, 4), (8, 2), (8, 4), (16, 4), (12, 4)]


def _load(code: str):
    namespace: dict = {}
    exec(compile(code, "<probe>", "exec"), namespace)
    return namespace["DeepSpeedEngine"]


def _migrated() -> str:
    return migrate_code(PROBE, module=MODULE, package="deepspeed.runtime").code


def test_rewritten_with_the_accelerators_device_count_only_where_it_is_deepspeeds():
    code = _migrated()
    assert "local_all_to_all_groups(get_accelerator().device_count())" in code and "TODOV1" not in code
    other = PROBE.replace("from deepspeed.accelerator import get_accelerator", "from mylib import get_accelerator")
    out = migrate_code(other, module=MODULE, package="deepspeed.runtime")
    assert "local_all_to_all_groups" not in out.code and out.todos


def _run(engine_class, groups, world, rank):
    with fake_world(rank, world, deepspeed_comm=True):
        try:
            first = engine_class().build()
        except AssertionError as exc:
            return ("AssertionError", str(exc)), None
        got = plain(dict(first))
        holder = engine_class()
        again = holder.build()
        name = next(n for n, g in again.items() if g is not None and not isinstance(g, int))
        groups._release_process_group_references(again[name])
        return got, sorted(holder.local_all_to_all_group)


@pytest.mark.parametrize("world,per_node", CASES)
def test_rewritten_all_to_all_groups_equal_legacy(world, per_node, monkeypatch):
    installer = importlib.import_module("compat.install")  # compat.install is also a function attribute
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils import groups as legacy_groups

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(type(get_accelerator()), "device_count", lambda self: per_node)
    ranks = sorted({0, world // 2 + 1, world - 1})
    legacy = {rank: _run(_load(PROBE), legacy_groups, world, rank) for rank in ranks}
    migrated = _load(_migrated())
    unmigrated = _load(PROBE)
    installer.install()
    try:
        from deepspeed.utils import groups

        for rank in ranks:
            assert _run(migrated, groups, world, rank) == legacy[rank], rank
            if legacy[rank][1] is None:
                continue
            with fake_world(rank, world, deepspeed_comm=True):
                got = migrated().build()
                with record_new_groups() as created:
                    again = migrated().build()
                assert created == [] and again is got
                served = unmigrated().build()  # compat's legacy getter: the very dict and groups
                assert served is got and all(served[n] is got[n] for n in got)
    finally:
        installer.uninstall()
