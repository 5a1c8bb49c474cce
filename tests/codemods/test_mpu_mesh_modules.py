"""DeepSpeed 0.19.8's own modules, migrated by ``codemods.rules.mpu_internal``, behave as the installed
ones: the same results and the same collectives over the same groups, for every kind of mpu
(fake backend; the migrated module is loaded beside the real one, not in its place)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import types

import pytest
import torch
import torch.distributed as dist
from test_mpu_mesh import build_mpus

from codemods import migrate_code
from codemods.rules.mpu_internal import MpuInternalCommand
from fakepg import fake_world

pytestmark = pytest.mark.deepspeed

_migrated: dict[str, tuple[types.ModuleType, int]] = {}


def migrated(name: str) -> tuple[types.ModuleType, int]:
    """The installed module ``name`` migrated (mpu/bwc codemod only), and its rewritten-site count."""
    if name not in _migrated:
        spec = importlib.util.find_spec(name)
        with open(spec.origin, encoding="utf-8") as fh:
            source = fh.read()
        package = name.rpartition(".")[0]
        done = migrate_code(source, module=name, package=package, codemods=(MpuInternalCommand,))
        module = types.ModuleType(name)
        module.__package__, module.__file__ = package, spec.origin
        exec(compile(done.code, f"<migrated {name}>", "exec"), module.__dict__)
        _migrated[name] = (module, sum(done.sites.values()))
    return _migrated[name]


@pytest.fixture
def collectives(monkeypatch):
    """Every deepspeed.comm collective called, as (name, group ranks or None)."""
    import deepspeed.comm as comm

    calls: list = []
    for name in ("all_reduce", "all_gather_into_tensor", "broadcast", "all_gather"):
        original = getattr(comm, name)

        def record(*args, _name=name, _original=original, **kwargs):
            group = kwargs.get("group")
            calls.append((_name, None if group is None else tuple(dist.get_process_group_ranks(group))))
            return _original(*args, **kwargs)

        monkeypatch.setattr(comm, name, record)
    return calls


def params(rank: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(rank)
    out = []
    for i, shape in enumerate([(4, 3), (5,), (2, 2)]):
        p = torch.nn.Parameter(torch.randn(shape))
        p.grad = torch.randn(shape)
        if i == 0:
            p.model_parallel = True
        out.append(p)
    return out


def run_both(call, mpus, collectives) -> int:
    """``call(module, mpu)`` on the installed and the migrated module for every mpu; same results,
    same collectives. Returns how many (mpu, call) pairs ran on legacy."""
    ran = 0
    for kind, mpu in mpus.items():
        results = []
        for module in call.modules:
            collectives.clear()
            try:
                value = call(module, mpu)
            except (AttributeError, AssertionError) as err:
                value = ("raised", type(err).__name__)
            results.append((value, list(collectives)))
        (want, want_calls), (got, got_calls) = results
        if isinstance(want, tuple) and want and want[0] == "raised":
            continue  # legacy did not run here
        ran += 1
        assert got_calls == want_calls, (kind, want_calls, got_calls)
        if torch.is_tensor(want):
            assert torch.equal(want, got), kind
        elif dataclasses.is_dataclass(want):  # each module defines its own class
            assert dataclasses.asdict(got) == dataclasses.asdict(want), (kind, want, got)
        else:
            assert got == want, (kind, want, got)
    return ran


def modules(name: str) -> tuple[types.ModuleType, types.ModuleType]:
    module, rewritten = migrated(name)
    assert rewritten > 0, name
    return importlib.import_module(name), module


@pytest.mark.parametrize("world, rank, pp, tp", [(8, 5, 2, 2), (8, 2, 1, 4), (16, 11, 2, 4), (4, 3, 1, 2)])
def test_runtime_utils_norms_and_overflow(world, rank, pp, tp, collectives):
    legacy, new = modules("deepspeed.runtime.utils")
    with fake_world(rank, world, deepspeed_comm=True):
        mpus = build_mpus(pp, tp)
        checks = {
            "clip_grad_norm_": lambda m, mpu: m.clip_grad_norm_(params(rank), 1.0, mpu=mpu),
            "clip_grad_norm_inf": lambda m, mpu: m.clip_grad_norm_(params(rank), 1.0, norm_type=float("inf"), mpu=mpu),
            "get_flattened_grad_norm": lambda m, mpu: m.get_flattened_grad_norm(params(rank), mpu=mpu),
            "get_grad_zeros": lambda m, mpu: m.get_grad_zeros(params(rank), mpu=mpu),
            "get_weight_norm": lambda m, mpu: m.get_weight_norm(params(rank), mpu=mpu),
            "get_global_norm_of_tensors": lambda m, mpu: float(
                m.get_global_norm_of_tensors([p.grad for p in params(rank)], mpu=mpu)
            ),
            "CheckOverflow.check": lambda m, mpu: m.CheckOverflow([params(rank)], mpu=mpu).check(),
        }
        ran = 0
        for name, check in checks.items():
            check.modules = (legacy, new)
            ran += run_both(check, mpus, collectives)
        assert ran >= len(checks) * 4  # none, grid, Megatron-style, test MPU, MeshMPU at least
        if "parallel_state_sp" in mpus:
            mpus["parallel_state_sp"]._release_sequence_parallel_groups()


@pytest.mark.parametrize("world, rank, pp, tp", [(8, 6, 2, 2), (8, 1, 1, 4)])
def test_moe_mappings_and_checkpoint_info(world, rank, pp, tp, collectives, monkeypatch):
    import deepspeed.utils.groups as groups

    legacy, new = modules("deepspeed.moe.mappings")
    info_legacy, info_new = modules("deepspeed.runtime.model_checkpointing.utils")
    with fake_world(rank, world, deepspeed_comm=True):
        mpus = build_mpus(pp, tp)
        tokens = torch.arange(8, dtype=torch.float32)  # 1-D: the fake backend checks all_gather_into_tensor shapes

        def drop(m, mpu):
            monkeypatch.setattr(groups, "mpu", mpu)
            return m.drop_tokens(tokens, dim=0)

        def gather_shape(m, mpu):
            monkeypatch.setattr(groups, "mpu", mpu)
            return tuple(m.gather_tokens(tokens, dim=0).shape)

        def info(m, mpu):
            return m._create_model_parallel_info(mpu)

        drop.modules = gather_shape.modules = (legacy, new)
        info.modules = (info_legacy, info_new)
        assert run_both(drop, mpus, collectives) >= 4
        assert run_both(gather_shape, mpus, collectives) >= 4
        assert run_both(info, mpus, collectives) >= 1  # MeshMPU has every getter it asks for
        if "parallel_state_sp" in mpus:
            mpus["parallel_state_sp"]._release_sequence_parallel_groups()
