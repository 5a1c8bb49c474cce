"""The import graph of mesh_core / compat / codemods: no cycles, and the layers stay apart.

The graph is built from the source (``ast``), not by importing. An edge is every import that runs:
module-level imports, imports inside functions (a deferred import is still a dependency; it only
hides a cycle) *and* imports under ``if TYPE_CHECKING:`` (a type-only import is a dependency of the
module's interface: a cycle through one means the two modules do not know which is the lower
layer). The
implicit import of a parent package is not an edge; ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg`` itself.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Iterator, Optional

import pytest


def _root() -> pathlib.Path:
    here = pathlib.Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        if here.parent == here:
            raise RuntimeError("no pyproject.toml above this test")
        here = here.parent
    return here


ROOT = _root()
PACKAGES = ("mesh_core", "compat", "codemods")
# compat modules that wrap or patch deepspeed itself (the only ones that may import it)
COMPAT_DEEPSPEED_MODULES = frozenset(
    {
        "compat.config_loading",
        "compat.groups",
        "compat.initialize",
        "compat.install",
        "compat.install_patches",
        "compat.layout_config",
        "compat.shm_build",
        "compat.startup",
    }
)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement, and whether it runs only later: inside a function (when that is
    called) or under ``if TYPE_CHECKING:`` (never at run time, but still a dependency)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _runtime_imports(ast.Module(body=node.body, type_ignores=[]), True)
            for child in node.orelse:
                yield from _runtime_imports(ast.Module(body=[child], type_ignores=[]), in_function)
        else:
            inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _runtime_imports(node, inner)


def _targets(module: str, path: pathlib.Path, node: ast.stmt) -> list[str]:
    """Absolute names a statement imports (``from x import y``: ``x.y`` if a module, else ``x``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _first_party(name: str) -> Optional[str]:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """(first-party edges, top-level third-party packages, those imported at module level) per module."""
    edges: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    eager: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges[module], external[module], eager[module] = set(), set(), set()
        for node, in_function in _runtime_imports(tree):
            for target in _targets(module, path, node):
                known = _first_party(target)
                if known is None:
                    external[module].add(target.split(".")[0])
                    if not in_function:
                        eager[module].add(target.split(".")[0])
                elif known != module:
                    edges[module].add(known)
    return edges, external, eager


EDGES, EXTERNAL, EAGER_EXTERNAL = _graph()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _package(module: str) -> str:
    return module.split(".")[0]


def test_the_graph_sees_every_package():
    for package in PACKAGES:
        assert package in MODULES and len([m for m in MODULES if _package(m) == package]) > 3
    assert "mesh_core.registry" in EDGES["mesh_core.device_mesh"]  # a known edge is found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = _cycles(EDGES)
    assert not cycles, "import cycles (module-level, inside functions or type-only): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_graph_counts_type_only_and_deferred_imports():
    """A cycle through ``if TYPE_CHECKING:`` or an in-function import is found like any other."""
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\ndef f():\n    from pkg import c\n"
    )
    found = [(type(n).__name__, later) for n, later in _runtime_imports(ast.parse(source))]
    assert found == [("ImportFrom", False), ("ImportFrom", True), ("ImportFrom", True)]


@pytest.mark.parametrize(
    "package,forbidden", [("mesh_core", {"compat", "codemods"}), ("codemods", {"mesh_core", "compat"})]
)
def test_lower_layers_do_not_import_higher_ones(package, forbidden):
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in EDGES.items()
        if _package(m) == package
        for t in targets
        if _package(t) in forbidden
    )
    assert not bad, f"{package} must not import {sorted(forbidden)}: {bad}"


def test_importing_mesh_core_or_codemods_never_imports_deepspeed():
    """No module-level deepspeed import in mesh_core or codemods (a function handed a DeepSpeed
    object, e.g. a ZeRO-3 engine, may import what it needs from deepspeed when it is called)."""
    bad = sorted(
        m for m, ext in EAGER_EXTERNAL.items() if _package(m) in ("mesh_core", "codemods") and "deepspeed" in ext
    )
    assert not bad, f"deepspeed imported at module level by {bad}"


def test_compat_imports_deepspeed_only_where_it_patches_it():
    bad = sorted(m for m, ext in EXTERNAL.items() if _package(m) == "compat" and "deepspeed" in ext)
    assert set(bad) <= COMPAT_DEEPSPEED_MODULES, (
        f"{sorted(set(bad) - COMPAT_DEEPSPEED_MODULES)} import deepspeed; only the modules that wrap or "
        f"patch it may ({sorted(COMPAT_DEEPSPEED_MODULES)}): read deepspeed's objects there and pass them in"
    )


def test_mesh_core_core_does_not_import_its_cli():
    """With ``mesh_core/cli/`` as a subpackage, the core and the roles never import it."""
    cli = [m for m in MODULES if m.startswith("mesh_core.cli.") or m == "mesh_core.cli"]
    assert any(m.startswith("mesh_core.cli.") for m in cli), "mesh_core/cli/ is missing"
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in EDGES.items()
        if _package(m) == "mesh_core" and m not in cli and m != "mesh_core.__main__"
        for t in targets
        if t in cli
    )
    assert not bad, f"the core imports the command line: {bad}"


def test_the_mesh_api_is_defined_in_its_class():
    """No module assigns onto ``DeepSpeedDeviceMesh`` (``setattr`` or ``Class.attr = ...``)."""
    bad = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "DeepSpeedDeviceMesh"
                ):
                    bad.append(f"{module}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and node.args
            ):
                first = node.args[0]
                if isinstance(first, ast.Name) and first.id == "DeepSpeedDeviceMesh":
                    bad.append(f"{module}:{node.lineno}")
    assert not bad, f"attributes attached to DeepSpeedDeviceMesh outside its class: {bad}"
    from mesh_core import DeepSpeedDeviceMesh

    for name in ("from_groups", "from_mpu", "expert_groups"):
        assert name in vars(DeepSpeedDeviceMesh), name


def test_process_roles_have_one_owner():
    from mesh_core.roles.state import PROCESS_ROLES
    from mesh_core.runtime_hooks import all_to_all_groups, autotp_groups, process_experts

    assert autotp_groups() is PROCESS_ROLES.autotp
    assert all_to_all_groups() is PROCESS_ROLES.all_to_all
    assert process_experts() is PROCESS_ROLES.experts
