"""One home per concern: the structure checks that keep the tree from growing a second copy.

Read from the source (``ast``) where the question is "how many definitions", so a copy anywhere in
``mesh_core`` / ``compat`` / ``codemods`` / ``examples`` / ``tools`` / ``bench`` is found.
"""

from __future__ import annotations

import ast
import pathlib
import re

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
    from codemods.rules import _grid_api as grid_api
    from mesh_core import axis_names

    written = _dict_literals_mapping({"pipe", "data", "model"}, {"pp", "dp", "tp"})
    assert sorted(p.split(":")[0] for p in written) == ["codemods/rules/_grid_api.py", "mesh_core/axis_names.py"], (
        written
    )
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
            # either spelling of the slice (ruff format writes `[i + 1 :]`)
            if path.name != "row_major.py" and (
                "strides[i + 1] *" in text or re.search(r"math\.prod\(\w+\[i \+ 1 ?:\]\)", text)
            ):
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


# weight transfer's face: the names users import (docs/transfer.md); everything else in the package is private
TRANSFER_FACE = (
    "ParamLayout",
    "SyncStats",
    "TransferStats",
    "WeightLink",
    "own_box",
    "plan_transfer",
    "transfer",
    "transfer_weights",
)


def _transfer_imports(text: str) -> list[str]:
    """The modules a Python source or a Markdown page's code imports weight transfer from."""
    import re

    pattern = re.compile(
        r"^\s*(?:from\s+(mesh_core\.transfer\S*)\s+import\s+(.+)|import\s+(mesh_core\.transfer\S*))", re.M
    )
    found = []
    for match in pattern.finditer(text):
        module = match.group(1) or match.group(3)
        names = [n.split(" as ")[0].strip(" ()\\") for n in (match.group(2) or "").split("#")[0].split(",")]
        found.append(
            module
            if module != "mesh_core.transfer"
            else "mesh_core.transfer:" + ",".join(n for n in names if n and n not in TRANSFER_FACE)
        )
    return found


def test_weight_transfer_behind_one_face():
    """``mesh_core.transfer`` is a package whose ``__init__`` is the public surface (these names,
    each importable); its modules are private by name; no ``mesh_core.transfer_*`` module is left;
    examples/ and docs/ import weight transfer only from the face."""
    import mesh_core
    import mesh_core.transfer as face

    assert tuple(sorted(face.__all__)) == TRANSFER_FACE, face.__all__
    assert all(callable(getattr(face, name)) for name in face.__all__)
    assert mesh_core.transfer_weights is face.transfer_weights
    package = ROOT / "mesh_core" / "transfer"
    public = [p.name for p in package.rglob("*.py") if p.name != "__init__.py" and not p.name.startswith("_")]
    assert not public, f"modules of mesh_core/transfer/ must be private (_-prefixed): {public}"
    assert not sorted((ROOT / "mesh_core").glob("transfer_*.py")), "weight transfer lives in mesh_core/transfer/"
    wrong = []
    pages = [
        *(ROOT / "examples").rglob("*.py"),
        *(ROOT / "examples").rglob("*.md"),
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "README.md",
        ROOT / "MIGRATION.md",
    ]
    for path in pages:
        for module in _transfer_imports(path.read_text(encoding="utf-8")):
            if module != "mesh_core.transfer:":
                wrong.append(f"{path.relative_to(ROOT)}: {module}")
    assert not wrong, f"examples/docs import weight transfer other than from mesh_core.transfer's face: {wrong}"
    assert _transfer_imports(
        "from mesh_core.transfer._jobs import WeightLink\nimport mesh_core.transfer_jobs\n"
        "from mesh_core.transfer import WeightLink, _holders  # x\n"
    ) == ["mesh_core.transfer._jobs", "mesh_core.transfer_jobs", "mesh_core.transfer:_holders"]


# the modules of mesh_core that compat may import from (docs/architecture.md, "Faces"); each answers
# with its __all__ (mesh_core itself also with the face modules)
MESH_CORE_FACES = ("mesh_core", "mesh_core.runtime_hooks", "mesh_core.axis_names", "mesh_core.torch_compat")
PROJECT_PACKAGES = ("mesh_core", "compat", "codemods", "ds_mesh_advice")
# top-level modules of the distribution outside the packages, private by name on purpose (docs/architecture.md)
DISTRIBUTION_MODULES = ("_ds_mesh_startup", "_ds_mesh_doctor")
# the one home per package of a third party's private names
THIRD_PARTY_PRIVATE_HOMES = ("mesh_core/torch_compat.py", "codemods/_engine/libcst_private.py")


def _face_names() -> dict[str, set[str]]:
    import importlib

    names = {face: set(importlib.import_module(face).__all__) for face in MESH_CORE_FACES}
    names["mesh_core"] |= {face.rsplit(".", 1)[1] for face in MESH_CORE_FACES if "." in face}
    return names


def _compat_mesh_core_uses(root: pathlib.Path = ROOT) -> list[tuple[str, str, str]]:
    """``(where, module, name)`` for every name compat takes from mesh_core: imported names, and the
    attributes read off an imported mesh_core module (``torch_compat.check_torch``)."""
    uses = []
    for path in sorted((root / "compat").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = lambda node: f"{path.relative_to(root)}:{node.lineno}"  # noqa: E731
        modules: dict[str, str] = {}  # local name -> the mesh_core module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "mesh_core":
                        if alias.asname is None:  # `import mesh_core.x` binds mesh_core: read as a module
                            uses.append((where(node), alias.name, ""))
                        else:
                            modules[alias.asname] = alias.name
            elif (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").split(".")[0] == "mesh_core"
            ):
                for alias in node.names:
                    uses.append((where(node), node.module, alias.name))
                    full = f"{node.module}.{alias.name}"
                    if full in MESH_CORE_FACES:
                        modules[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                uses.append((where(node), modules[node.value.id], node.attr))
    return uses


def test_compat_imports_mesh_core_through_its_faces_only():
    """compat takes from ``mesh_core`` only what a face exports: ``mesh_core`` (the user API),
    ``mesh_core.runtime_hooks`` (what the DeepSpeed runtime uses), ``mesh_core.axis_names`` (the
    dim vocabulary) and ``mesh_core.torch_compat`` (the supported torch range)."""
    faces = _face_names()
    uses = _compat_mesh_core_uses()
    assert any(m == "mesh_core.runtime_hooks" for _, m, _ in uses) and any(
        m == "mesh_core.torch_compat" for _, m, _ in uses
    )
    behind = [f"{w} {m}" for w, m, _ in uses if m not in faces]
    assert not behind, f"compat imports mesh_core modules that are not faces: {behind}"
    unexported = [f"{w} {m}.{n}" for w, m, n in uses if m in faces and n not in faces[m]]
    assert not unexported, f"compat uses names a mesh_core face does not export: {unexported}"


def test_the_face_check_finds_a_reach_behind_the_faces(tmp_path):
    """A compat module reaching behind the faces, or for a name a face does not export, is found."""
    (tmp_path / "compat").mkdir()
    (tmp_path / "compat" / "x.py").write_text(
        "import mesh_core.roles.hpz\nfrom mesh_core.roles.pipe_topology import exact_int\n"
        "from mesh_core import torch_compat\ntorch_compat._newest_torch\nfrom mesh_core.runtime_hooks import _x\n"
    )
    faces = _face_names()
    uses = {(m, n) for _, m, n in _compat_mesh_core_uses(tmp_path)}
    assert uses == {
        ("mesh_core.roles.hpz", ""),
        ("mesh_core.roles.pipe_topology", "exact_int"),
        ("mesh_core", "torch_compat"),
        ("mesh_core.torch_compat", "_newest_torch"),
        ("mesh_core.runtime_hooks", "_x"),
    }
    assert [(m, n) for m, n in sorted(uses) if m in faces and n in faces[m]] == [("mesh_core", "torch_compat")]


def test_no_private_name_is_imported_across_packages():
    """Between the project's packages only public names travel (a package's private names are its
    own); a third party's private names are imported in one home per package."""
    bad, third = [], []
    for path, tree in _source_trees(PROJECT_PACKAGES):
        package = path.relative_to(ROOT).parts[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top == package or top in DISTRIBUTION_MODULES:
                    continue
                private = [p for p in module.split(".") + names if p.startswith("_") and not p.startswith("__")]
                if private and top in PROJECT_PACKAGES:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {module} {private}")
                elif private and str(path.relative_to(ROOT)) not in THIRD_PARTY_PRIVATE_HOMES:
                    third.append(f"{path.relative_to(ROOT)}:{node.lineno} {module} {private}")
    assert not bad, f"private names imported across packages: {bad}"
    assert not third, f"a third party's private names outside {THIRD_PARTY_PRIVATE_HOMES}: {third}"


def test_the_mesh_class_has_at_most_16_public_methods():
    """The legacy roles (expert groups by name, hpZ) are functions taking the mesh, not methods
    (15 of the mesh's own, and torch DeviceMesh's ``get_local_rank``; inherited ones count)."""
    import inspect

    from mesh_core import DeepSpeedDeviceMesh

    public = sorted(
        {
            n
            for cls in DeepSpeedDeviceMesh.__mro__[:-1]
            for n, v in vars(cls).items()
            if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod, property)))
        }
    )
    assert len(public) <= 16 and {"get_rank", "get_local_rank"} <= set(public), public
    for role in ("hpz_group", "create_hpz_group", "expert_groups_named", "register_expert_groups"):
        assert not hasattr(DeepSpeedDeviceMesh, role), role


def test_codemods_import_runtime_hooks_from_their_module():
    """The codemods (which never import mesh_core) list the names they import from
    ``mesh_core.runtime_hooks``; every one is there, and none is a user name."""
    import mesh_core
    from codemods._engine import base
    from mesh_core import runtime_hooks

    assert base.HOOKS_MODULE == runtime_hooks.__name__
    assert base.RUNTIME_HOOK_NAMES <= set(runtime_hooks.__all__)
    assert not base.RUNTIME_HOOK_NAMES & set(mesh_core.__all__)


def test_codemod_rules_call_no_private_method_of_a_command():
    """Rule modules reach their command through ``codemods.rules._rule_api.RuleHost`` only."""
    bad = []
    for path in sorted((ROOT / "codemods").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "command"
                and node.attr.startswith("_")
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} command.{node.attr}")
    assert not bad, f"private command members used by rules: {bad}"
    from codemods.rules._rule_api import RuleHost
    from codemods.rules.groups_getters import GroupsGettersCommand

    members = {n for n in vars(RuleHost) if not n.startswith("_")} - {"context"}
    assert members and all(callable(getattr(GroupsGettersCommand, n, None)) for n in members), members


def _source_trees(folders=("mesh_core", "compat", "codemods")):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_one_rank_decode():
    """Every ``(i // stride) % size`` is ``mesh_core.row_major.coord_along`` (read from the AST)."""
    inline = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in _source_trees()
        if path.name != "row_major.py"
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mod)
        and isinstance(node.left, ast.BinOp)
        and isinstance(node.left.op, ast.FloorDiv)
    ]
    assert not inline, f"row-major decodes outside mesh_core/row_major.py: {inline}"
    from mesh_core import MeshLayout, MeshSpec, row_major

    layout = MeshLayout(MeshSpec.build(24, pp=2, dp=3, sp=2, tp=2))
    for rank in range(24):
        assert layout.rank_at(**layout.coordinate(rank)) == rank
        assert row_major.flat_index(row_major.coords(rank, (2, 3, 2, 2), layout._strides), layout._strides) == rank


def test_one_is_auto():
    """One ``is_auto`` (``mesh_core.spec``); a near-miss like ``" auto "`` gets the one "auto" message
    before any process group exists, from the config and from Python alike."""
    import pytest
    import torch.distributed as dist

    from compat.engine_spec import check_before_world
    from mesh_core import MeshSpec, MeshSpecError
    from mesh_core.spec import auto_message, is_auto

    defined = [
        f"{path.relative_to(ROOT)}"
        for path, tree in _source_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == "is_auto"
    ]
    assert defined == ["mesh_core/spec.py"], defined
    assert all(is_auto(v) for v in ("auto", "AUTO", None, -1)) and not any(is_auto(v) for v in (" auto ", 1, True, "2"))
    assert not dist.is_initialized()
    with pytest.raises(MeshSpecError) as before_world:
        check_before_world({"mesh": {"tp": 2, "dp": " auto "}})
    assert str(before_world.value) == auto_message("config 'mesh.dp'=' auto '")
    with pytest.raises(MeshSpecError, match='write "auto" exactly'):
        MeshSpec.build(8, tp=2, dp=" auto ")
    assert MeshSpec.build(8, tp=2, dp="auto").dim_size("dp") == 4 == MeshSpec.build(8, tp=2, dp=-1).dim_size("dp")
    with pytest.raises(MeshSpecError, match='positive integer — write "auto"'):
        check_before_world({"mesh": {"tp": -1}})  # a config says "auto", not -1


def test_one_autotp_off_rule():
    """``autotp_size`` 0 / 1 turns AutoTP off: written once (``mesh_core.config.autotp_off``)."""
    from mesh_core.config import autotp_off

    written = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in _source_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and "autotp" in ast.unparse(node.left)
        and any(isinstance(c, ast.Tuple) and 0 in [getattr(e, "value", None) for e in c.elts] for c in node.comparators)
        and path.name != "config.py"
    ]
    assert not written, f"the AutoTP-off values written outside mesh_core/config.py: {written}"
    assert autotp_off({"tensor_parallel": {"autotp_size": 0}}) and autotp_off({"tensor_parallel": {"autotp_size": 1}})
    assert not autotp_off({"tensor_parallel": {"autotp_size": 2}}) and not autotp_off({"mesh": {"tp": 2}})


def test_one_list_of_dim_names():
    """The dim names are written once (``mesh_core.axis_names``: the ``MeshDim`` enum, the legacy
    dims and the aliases as data); nowhere else spells the legacy four or the six as a tuple."""
    from mesh_core import axis_names
    from mesh_core.spec import MESH_DIMS

    legacy, every = ["pp", "dp", "sp", "tp"], sorted(MESH_DIMS)
    written = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in _source_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Tuple)
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
        and ([e.value for e in node.elts] == legacy or sorted(e.value for e in node.elts) == every)
        and path.name != "axis_names.py"
    ]
    assert not written, f"dim names spelled outside mesh_core/axis_names.py: {written}"
    assert MESH_DIMS == tuple(d.value for d in axis_names.MeshDim) and axis_names.MeshDim.TP == "tp"
    assert set(axis_names.ALIASES.values()) <= set(MESH_DIMS) and axis_names.ALIASES["fsdp"] == "dp_shard"


# Each face's size, held: a name joins a face deliberately, with its line in the face's docstring
# (who uses it outside the package), and its number here raised in the same change; a name with no
# user outside is imported from its home module instead.
FACE_SIZES = {
    "mesh_core": 15,
    "mesh_core.runtime_hooks": 52,
    "mesh_core.axis_names": 4,
    "mesh_core.torch_compat": 27,
    "compat": 11,
    "codemods": 8,
}


def test_each_face_holds_its_size_and_says_who_uses_each_name():
    """The faces' ``__all__`` sizes are the numbers above, and every name a face exports is named in
    its docstring (``runtime_hooks`` and ``axis_names``: one ``- ``name`` — who uses it`` line each)."""
    import importlib

    sizes, unexplained = {}, {}
    for face, size in FACE_SIZES.items():
        module = importlib.import_module(face)
        sizes[face] = len(module.__all__)
        if face in ("mesh_core.runtime_hooks", "mesh_core.axis_names"):
            lines = re.findall(r"^- ``(\w+)`` — \S", module.__doc__, re.M)
            assert len(lines) == len(set(lines)), f"{face}: a name has two lines in the docstring"
            missing = set(module.__all__) ^ set(lines)
        else:
            missing = {n for n in module.__all__ if not re.search(rf"[`.~]{n}`", module.__doc__)}
        if missing:
            unexplained[face] = sorted(missing)
    changed = {face: f"{sizes[face]} names, held at {size}" for face, size in FACE_SIZES.items() if sizes[face] != size}
    assert not changed, (
        f"a face changed size: {changed}. Adding a name: give it a line in the face's docstring saying who "
        "outside the package uses it, and change its number in FACE_SIZES (tests/test_structure.py) in the "
        "same commit; a name only the package itself uses is imported from its home module, not the face."
    )
    assert not unexplained, f"names a face exports without a word in its docstring on who uses them: {unexplained}"
