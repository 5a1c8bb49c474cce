"""One home per concern: the structure checks that keep the tree from growing a second copy.

Read from the source (``ast``) where the question is "how many definitions", so a copy anywhere in
``mesh_core`` / ``compat`` / ``codemods`` / ``examples`` / ``tools`` / ``bench`` is found.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("mesh_core", "compat", "codemods", "examples", "tools", "bench")


def _definitions(name: str) -> list[str]:
    found = []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_one_config_to_spec_path():
    """``spec_from_config`` is defined once; the shim's ``engine_spec`` is built on it."""
    assert _definitions("spec_from_config") == [_definitions("spec_from_config")[0]]
    assert _definitions("spec_from_config")[0].startswith("mesh_core/config.py:")
    tree = ast.parse((ROOT / "compat" / "engine_spec.py").read_text(encoding="utf-8"))
    engine_spec = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "engine_spec")
    calls = {n.func.id for n in ast.walk(engine_spec) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "spec_from_config" in calls
    assert not any(isinstance(n, ast.Attribute) and n.attr == "build" for n in ast.walk(tree)), (
        "compat.engine_spec builds a MeshSpec itself; it must go through mesh_core.config.spec_from_config"
    )


def _dict_literals_mapping(keys: set, values: set) -> list[str]:
    """Dict displays / comprehensions whose constant keys and values are ``keys`` → ``values``
    (either way round)."""
    found = []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Dict) and node.keys and all(isinstance(k, ast.Constant) for k in node.keys):
                    ks = {k.value for k in node.keys}
                    vs = {v.value for v in node.values if isinstance(v, ast.Constant)}
                    if (ks, vs) in ((keys, values), (values, keys)):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_one_axis_name_map():
    """pipe/data/model ↔ pp/dp/tp is written once in mesh_core and once in the codemods (which do
    not import mesh_core at run time); the two are equal."""
    from codemods import grid_api
    from mesh_core import axis_names

    written = _dict_literals_mapping({"pipe", "data", "model"}, {"pp", "dp", "tp"})
    assert sorted(p.split(":")[0] for p in written) == ["codemods/grid_api.py", "mesh_core/axis_names.py"], written
    assert grid_api.AXIS_TO_DIM == axis_names.AXIS_TO_DIM
    assert axis_names.DIM_TO_AXIS == {v: k for k, v in axis_names.AXIS_TO_DIM.items()}


def test_one_row_major_math():
    """Strides are computed in ``mesh_core.row_major`` only; the topologies share one class."""
    from compat.topology import ProcessTopology
    from mesh_core.roles.pipe_topology import PipelineTopology

    assert issubclass(ProcessTopology, PipelineTopology)
    computing = []
    for folder in ("mesh_core", "compat"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if path.name != "row_major.py" and ("strides[i + 1] *" in text or "math.prod(dims[i + 1:])" in text):
                computing.append(str(path.relative_to(ROOT)))
    assert not computing, f"row-major strides computed outside mesh_core/row_major.py: {computing}"
    topo = PipelineTopology(["pipe", "data", "model"], [2, 3, 2])
    for rank in range(12):
        assert topo.get_rank(**topo.get_coord(rank)._asdict()) == rank


def test_a_narrow_public_api():
    """``mesh_core`` exports user names only (at most 15, ``transfer_weights`` among them); what the
    DeepSpeed runtime uses lives in ``mesh_core.runtime_hooks``, and the two do not overlap."""
    import mesh_core
    from mesh_core import runtime_hooks

    assert len(mesh_core.__all__) <= 15, mesh_core.__all__
    assert "transfer_weights" in mesh_core.__all__ and callable(mesh_core.transfer_weights)
    assert not set(mesh_core.__all__) & set(runtime_hooks.__all__)
    for name in ("serve_process_experts", "release_hpz_groups", "registry_for_world", "hpz_group", "init_autotp"):
        assert name in runtime_hooks.__all__ and not hasattr(mesh_core, name), name
    for module in (mesh_core, runtime_hooks):
        assert all(hasattr(module, name) for name in module.__all__)


def test_the_mesh_class_has_at_most_15_public_methods():
    """The legacy roles (expert groups by name, hpZ) are functions taking the mesh, not methods."""
    import inspect

    from mesh_core import DeepSpeedDeviceMesh

    public = sorted(n for n, v in vars(DeepSpeedDeviceMesh).items() if not n.startswith("_")
                    and (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod, property))))
    assert len(public) <= 15, public
    for role in ("hpz_group", "create_hpz_group", "expert_groups_named", "register_expert_groups"):
        assert not hasattr(DeepSpeedDeviceMesh, role), role


def test_codemods_import_runtime_hooks_from_their_module():
    """The codemods (which never import mesh_core) list the names they import from
    ``mesh_core.runtime_hooks``; every one is there, and none is a user name."""
    import mesh_core
    from codemods import base
    from mesh_core import runtime_hooks

    assert base.HOOKS_MODULE == runtime_hooks.__name__
    assert base.RUNTIME_HOOK_NAMES <= set(runtime_hooks.__all__)
    assert not base.RUNTIME_HOOK_NAMES & set(mesh_core.__all__)


def test_codemod_rules_call_no_private_method_of_a_command():
    """Rule modules reach their command through ``codemods.rule_api.RuleHost`` only."""
    bad = []
    for path in sorted((ROOT / "codemods").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "command"
                    and node.attr.startswith("_")):
                bad.append(f"{path.name}:{node.lineno} command.{node.attr}")
    assert not bad, f"private command members used by rules: {bad}"
    from codemods.groups_getters import GroupsGettersCommand
    from codemods.rule_api import RuleHost

    members = {n for n in vars(RuleHost) if not n.startswith("_")} - {"context"}
    assert members and all(callable(getattr(GroupsGettersCommand, n, None)) for n in members), members
