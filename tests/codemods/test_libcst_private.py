"""The private libcst names the codemods use: all in ``codemods._engine.libcst_private``, each
present in the libcst installed and behaving as the codemods rely on, and none used elsewhere.

"Used" is read from the source (``ast``) of every codemods module: an import of a private libcst
module or name, a private attribute of a libcst class read or written (``wrapper._metadata``), a
private libcst method overridden (``def _handle_metadata_reference`` in a subclass of a libcst
class), or a private name spelled as a string. CI runs this file and the codemods tests on the
lowest libcst pyproject allows too (``.ci/run``; by hand: docs/codemods_safety.md "libcst range").
"""

from __future__ import annotations

import ast
import importlib
import pathlib
from contextlib import contextmanager

import libcst as cst
import pytest
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.matchers import MatcherDecoratableTransformer
from libcst.metadata import ExpressionContextProvider, MetadataWrapper, ParentNodeProvider, PositionProvider

from codemods._engine import libcst_private

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOME = ROOT / "codemods" / "_engine" / "libcst_private.py"


def test_every_private_name_resolves_on_this_libcst():
    for name in libcst_private.__all__:
        assert getattr(libcst_private, name) is not None, name
    assert libcst_private.top_imports_gatherer() is not None
    assert callable(libcst_private.gather_matchers)
    assert isinstance(libcst_private.MODULES_IGNORED_BY_DEFAULT, (set, frozenset, list, tuple))
    assert hasattr(cst.Name, libcst_private.VISIT_AND_REPLACE_CHILDREN)
    transformer = MatcherDecoratableTransformer()
    for attr in (libcst_private.EXTRA_VISIT_FUNCS, libcst_private.EXTRA_LEAVE_FUNCS):
        assert hasattr(transformer, attr), attr
    assert issubclass(cst.CSTVisitor, libcst_private.CSTTypedBaseFunctions)
    assert libcst_private.LazyValue(lambda: 3)() == 3


def test_a_wrappers_stored_metadata_is_what_libcst_resolves_from():
    """``stored_metadata(wrapper)`` (``MetadataWrapper._metadata``): what ``resolve`` computed is
    stored there; what is stored there is what ``resolve`` / ``resolve_many`` and a visitor's
    ``self.metadata`` get, uncomputed; what is deleted there is computed again."""
    module = cst.parse_module("x = 1\ny = x\n")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    store = libcst_private.stored_metadata(wrapper)
    assert PositionProvider not in store
    positions = wrapper.resolve(PositionProvider)
    assert store[PositionProvider] is positions and positions[module.body[1]].start.line == 2

    stand_in = {module: "stand-in"}
    store[ParentNodeProvider] = stand_in
    assert wrapper.resolve(ParentNodeProvider) is stand_in
    assert wrapper.resolve_many([ParentNodeProvider])[ParentNodeProvider] is stand_in
    seen = []

    class Reader(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (ParentNodeProvider,)

        def visit_Module(self, node):
            seen.append(self.metadata[ParentNodeProvider])

    wrapper.visit(Reader())
    assert seen == [stand_in]

    del store[ParentNodeProvider]
    parents = wrapper.resolve(ParentNodeProvider)
    assert parents is not stand_in and parents[module.body[0]] is module


def test_a_providers_computed_values_are_its_resolved_metadata():
    """``computed_metadata(provider)`` (``BaseMetadataProvider._computed``) after the provider's own
    walk is what libcst's resolution of that provider gives."""
    module = cst.parse_module("def f(a):\n    b = a\n    return b\n")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    provider = ExpressionContextProvider()
    with provider.resolve(wrapper):
        provider.visit_Module(module)  # as codemods._engine.metadata.resolve_scopes does
    computed = libcst_private.computed_metadata(provider)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ExpressionContextProvider)
    assert computed and dict(computed) == dict(expected)


def test_the_metadata_reference_hook_is_what_transform_module_enters():
    """``MetadataReferenceHook`` (``Codemod._handle_metadata_reference``): ``transform_module`` enters
    ``metadata_reference(module)`` and transforms the tree it yields; libcst's own (the default)
    resolves the codemod's metadata on that tree."""

    class Probe(libcst_private.MetadataReferenceHook, Codemod):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def __init__(self, context, replace=False):
            super().__init__(context)
            self.entered, self.replace = [], replace

        @contextmanager
        def metadata_reference(self, module):
            self.entered.append(module)
            if self.replace:
                yield module.with_changes(body=module.body[:1])
                return
            with self.libcst_metadata_reference(module) as tree:
                yield tree

        def transform_module_impl(self, tree):
            self.lines = (
                [self.get_metadata(PositionProvider, s).start.line for s in tree.body] if not self.replace else []
            )
            return tree.with_changes(body=tree.body[::-1])

    module = cst.parse_module("x = 1\ny = 2\n")
    probe = Probe(CodemodContext())
    assert probe.transform_module(module).code == "y = 2\nx = 1\n"
    assert probe.entered == [module] and probe.lines == [1, 2]
    replaced = Probe(CodemodContext(), replace=True)
    assert replaced.transform_module(module).code == "x = 1\n" and replaced.entered == [module]


def test_the_transform_run_hook_runs_the_chained_import_passes():
    """``TransformRunHook`` (``CodemodCommand._instantiate_and_run``): a command's chained import
    passes (``AddImportsVisitor`` here) run through ``run_transform(transform, tree)``."""

    class Command(libcst_private.TransformRunHook, VisitorBasedCodemodCommand):
        def __init__(self, context):
            super().__init__(context)
            self.ran = []

        def run_transform(self, transform, tree):
            self.ran.append(transform)
            return super().run_transform(transform, tree)

        def visit_Module(self, node):
            AddImportsVisitor.add_needed_import(self.context, "os")

    command = Command(CodemodContext())
    code = command.transform_module(cst.parse_module("x = 1\n")).code
    assert code.startswith("import os\n") and code.endswith("\nx = 1\n")
    assert command.ran == [AddImportsVisitor]


def test_remove_imports_takes_the_unused_imports_it_is_handed():
    """``set_unused_imports`` (``RemoveImportsVisitor._unused_imports``): a ``RemoveImportsVisitor``
    whose pre-pass is replaced removes the scheduled imports it was handed as unused, and only
    those (libcst's own pre-pass keeps ``os``, which is used)."""
    assert libcst_private.remove_imports_keeps_unused_imports()
    source = "import os, sys\nos.path\n"

    def removed(visitor_class):
        context = CodemodContext()
        for name in ("os", "sys"):
            RemoveImportsVisitor.remove_unused_import(context, name)
        return visitor_class(context).transform_module(cst.parse_module(source)).code

    class HandedBoth(RemoveImportsVisitor):
        def visit_Module(self, node):
            statement = node.body[0].body[0]
            libcst_private.set_unused_imports(self, {alias: statement for alias in statement.names})

    assert removed(RemoveImportsVisitor) == "import os\nos.path\n"
    assert removed(HandedBoth) == "os.path\n"


# --- where private libcst names are used ---------------------------------------------------------


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _libcst_class_privates() -> dict[str, set[str]]:
    """``{libcst class qualname (module.Class): its private names}``: methods, class attributes,
    ``__slots__`` and ``self._x = ...`` stores, read from libcst's source."""
    found: dict[str, set[str]] = {}
    package = pathlib.Path(cst.__file__).parent
    for path in package.rglob("*.py"):
        if "tests" in path.relative_to(package).parts:
            continue
        module = "libcst." + ".".join(path.relative_to(package).with_suffix("").parts).removesuffix(".__init__")
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(cls, ast.ClassDef):
                continue
            names = found.setdefault(f"{module}.{cls.name}", set())
            for node in cls.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(node.name):
                    names.add(node.name)
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AnnAssign)
                    else []
                )
                for target in targets:
                    if isinstance(target, ast.Name) and _is_private(target.id):
                        names.add(target.id)
                    if isinstance(target, ast.Name) and target.id == "__slots__":
                        names |= {
                            e.value
                            for e in ast.walk(node.value)
                            if isinstance(e, ast.Constant) and isinstance(e.value, str) and _is_private(e.value)
                        }
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                    and _is_private(node.attr)
                ):
                    names.add(node.attr)
    return found


LIBCST_PRIVATES = _libcst_class_privates()
ALL_LIBCST_PRIVATES = set().union(*LIBCST_PRIVATES.values())


def _libcst_privates_of(cls: type) -> set[str]:
    """The private names of the libcst classes ``cls`` is or will be mixed with: those in its MRO or
    in the MRO of any of its subclasses (a mixin's methods override libcst's in those)."""
    names: set[str] = set()
    todo, seen = [cls], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for base in current.__mro__:
            names |= LIBCST_PRIVATES.get(f"{base.__module__}.{base.__qualname__}", set())
        todo += current.__subclasses__()
    return names


def private_libcst_uses(source: str, namespace: dict, where: str) -> list[str]:
    """Every use of a private libcst name in ``source`` (a module whose objects are ``namespace``)."""
    tree = ast.parse(source)
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    inherited = {
        name: _libcst_privates_of(namespace[name]) if isinstance(namespace.get(name), type) else set()
        for name in classes
    }
    # the private names the module's own classes (none of them libcst's) define for themselves
    own = {
        item.attr
        for name, node in classes.items()
        if not inherited[name]
        for item in ast.walk(node)
        if isinstance(item, ast.Attribute)
        and isinstance(item.ctx, ast.Store)
        and isinstance(item.value, ast.Name)
        and item.value.id == "self"
    }
    own |= {
        item.name
        for name, node in classes.items()
        if not inherited[name]
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    own |= {
        target.id
        for name, node in classes.items()
        if not inherited[name]
        for item in node.body
        if isinstance(item, (ast.Assign, ast.AnnAssign))
        for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "libcst":
            if any(_is_private(p) for p in node.module.split(".")) or any(_is_private(a.name) for a in node.names):
                found.append(f"{where}:{node.lineno} import from {node.module}")
        elif isinstance(node, ast.Import):
            found += [
                f"{where}:{node.lineno} import {a.name}"
                for a in node.names
                if a.name.split(".")[0] == "libcst" and any(_is_private(p) for p in a.name.split("."))
            ]
        elif isinstance(node, ast.ClassDef):
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in inherited[node.name]:
                    found.append(f"{where}:{item.lineno} overrides {node.name}.{item.name}")
                elif (
                    isinstance(item, ast.Attribute)
                    and isinstance(item.value, ast.Name)
                    and item.value.id == "self"
                    and item.attr in inherited[node.name]
                ):
                    found.append(f"{where}:{item.lineno} self.{item.attr} in {node.name}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ALL_LIBCST_PRIVATES
            and node.attr not in own
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")
        ):
            found.append(f"{where}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ALL_LIBCST_PRIVATES:
            found.append(f"{where}:{node.lineno} {node.value!r}")
    return found


LEGACY = "from deepspeed.utils import groups\ngroups.get_data_parallel_group()\n"
MIGRATED = 'from mesh_core import current_mesh\n\ncurrent_mesh().get_group("dp")\n'


def _codemods_modules():
    for path in sorted((ROOT / "codemods").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        yield path, name


def test_no_codemods_module_but_its_home_uses_a_private_libcst_name():
    from codemods import migrate_code

    # one migration that adds and removes imports: the engine's mixins for libcst's import passes
    # (codemods._engine.metadata.lazy) exist, so their libcst bases are known to the scan
    assert migrate_code(LEGACY).code == MIGRATED
    checked, bad = 0, []
    for path, name in _codemods_modules():
        if path == HOME:
            continue
        checked += 1
        bad += private_libcst_uses(
            path.read_text(encoding="utf-8"), vars(importlib.import_module(name)), str(path.relative_to(ROOT))
        )
    assert checked > 30
    assert not bad, f"private libcst names used outside {HOME.relative_to(ROOT)}: {bad}"


def test_the_home_uses_each_private_name_it_wraps():
    """The scan finds in the home what it would find anywhere else: each kind of use."""
    found = " ".join(private_libcst_uses(HOME.read_text(encoding="utf-8"), vars(libcst_private), "home"))
    for use in (
        "import from libcst._typed_visitor",
        "._metadata",
        "._computed",
        "overrides MetadataReferenceHook._handle_metadata_reference",
        "overrides TransformRunHook._instantiate_and_run",
        "._unused_imports",
        "'_visit_and_replace_children'",
    ):
        assert use in found, (use, found)


@pytest.mark.parametrize(
    "source, use",
    [
        ("from libcst.metadata.wrapper import _gen_batchable\n", "import from libcst.metadata.wrapper"),
        ("import libcst._nodes.base\n", "import libcst._nodes.base"),
        ("def f(wrapper):\n    return wrapper._metadata\n", "._metadata"),
        (
            "from libcst.codemod import CodemodCommand\nclass K(CodemodCommand):\n    def _instantiate_and_run(self, t, m):\n        pass\n",
            "overrides K._instantiate_and_run",
        ),
        (
            "import libcst as cst\nclass N(cst.Name):\n    def _visit_and_replace_children(self, v):\n        pass\n",
            "overrides N._visit_and_replace_children",
        ),
        (
            "from libcst.codemod import Codemod\nclass C(Codemod):\n    def f(self, m):\n        return super()._handle_metadata_reference(m)\n",
            "._handle_metadata_reference",
        ),
        ("def f(p):\n    return getattr(p, '_computed')\n", "'_computed'"),
        (
            "from libcst.codemod import Codemod\nclass M:\n    def _handle_metadata_reference(self, m):\n        pass\n"
            "class C(M, Codemod):\n    pass\n",
            "overrides M._handle_metadata_reference",
        ),
    ],
)
def test_the_scan_finds_each_kind_of_use(source, use):
    namespace: dict = {}
    exec(compile(source, "sample", "exec"), namespace)  # noqa: S102 (the samples above)
    assert any(use in hit for hit in private_libcst_uses(source, namespace, "sample")), use


def test_the_scan_leaves_a_codemods_own_private_names_alone():
    source = (
        "import libcst as cst\nclass Place(cst.CSTTransformer):\n    def __init__(self):\n        self._stack = []\n"
        "    def _pop(self):\n        return self._stack.pop()\nclass Own:\n    _value = 1\ndef f(o):\n    return o._value\n"
    )
    namespace: dict = {}
    exec(compile(source, "sample", "exec"), namespace)  # noqa: S102
    assert private_libcst_uses(source, namespace, "sample") == []


def test_the_libcst_range_is_declared_with_both_ends():
    import re

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"libcst>=([0-9.]+),<([0-9.]+)"', text)
    assert match, 'pyproject must bound libcst on both sides, e.g. "libcst>=1.2,<1.10"'
