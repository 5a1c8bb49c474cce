"""RemoveImportsVisitor's unused imports found without scopes where a name nothing may read decides
(codemods._engine.metadata.unused_requested_imports): the same output as libcst's gatherer, on shapes
where the two could differ."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor

from codemods._engine import metadata

HEADER = (
    "from __future__ import annotations\n"
    "import a.b.c\n"
    "import d as e, f\n"
    "from deepspeed.utils import groups, topology as topo\n"
    "from deepspeed.utils import groups as g2\n"
    "from . import sibling\n"
    "from .pkg import rel\n"
    "from star import *\n"
)
REMOVALS = [
    ("a.b.c", None, None),
    ("d", None, "e"),
    ("f", None, None),
    ("deepspeed.utils", "groups", None),
    ("deepspeed.utils", "topology", "topo"),
    ("deepspeed.utils", "groups", "g2"),
    ("pkg", "sibling", None),
    ("pkg.pkg", "rel", None),
    ("__future__", "annotations", None),
    ("star", "x", None),
]
BODIES = {
    "nothing": "x = 1\n",
    "uses": "x = groups.get() + topo + e + f + a.b.c.d + g2\n",
    "shadowed": "def h(groups):\n    return groups\n",
    "attribute only": "x = y.groups + y.topo + y.e\n",
    "keyword only": "x = call(groups=1, topo=2)\n",
    "annotation string": "def h(x: 'groups.Group') -> 'topo':\n    pass\n",
    "all": "__all__ = ['groups', 'e']\n",
    "all concatenated": "__all__ = ['gro' 'ups']\n",
    "escaped": "__all__ = ['gro\\x75ps']\n",
    "docstring": '"""groups and topo"""\n',
    "fstring": "x = f'{groups}'\n",
    "nested import": "def h():\n    from deepspeed.utils import groups\n    return 1\n",
    "nested import used": "def h():\n    from deepspeed.utils import groups\n    return groups\n",
    "global": "def h():\n    global groups\n",
    "del": "del groups\n",
    "class": "class groups:\n    pass\n",
    "cast": "import typing\nx = typing.cast('topo', 1)\n",
    "dotted use": "x = a.q\n",
}


def _remove(source: str, package, fast: bool, monkeypatch) -> tuple[str, bool]:
    monkeypatch.setattr(metadata, "UNUSED_WITHOUT_SCOPES", fast)
    taken = []
    real = metadata.unused_requested_imports
    monkeypatch.setattr(metadata, "unused_requested_imports", lambda *a: taken.append(real(*a)) or taken[-1])
    context = CodemodContext(full_package_name=package, full_module_name=f"{package}.m" if package else None)
    for item in REMOVALS:
        RemoveImportsVisitor.remove_unused_import(context, *item)
    tree = cst.parse_module(source)
    with metadata.sharing():
        out = metadata.lazy(RemoveImportsVisitor)(context).transform_module(tree)
    return out.code, bool(taken) and taken[-1] is not None


@pytest.mark.parametrize("package", ["pkg", None])
@pytest.mark.parametrize("body", list(BODIES))
def test_unused_imports_without_scopes_are_libcsts(monkeypatch, body, package):
    source = HEADER.replace("from .pkg import rel\n", "from .pkg import rel\n" if package else "") + BODIES[body]
    if package is None:
        source = source.replace("from . import sibling\n", "")
    slow, _ = _remove(source, package, False, monkeypatch)
    fast, decided = _remove(source, package, True, monkeypatch)
    assert fast == slow
    if body in ("nothing", "nested import"):
        assert decided  # the cheap path was taken (else this test would not test it)


def test_the_cheap_path_decides_where_nothing_may_read_the_names(monkeypatch):
    source = HEADER.replace("from . import sibling\n", "") + "x = 1\n"
    code, decided = _remove(source, "pkg", True, monkeypatch)
    assert decided
    assert "groups" not in code and "topo" not in code and "import f" not in code
    assert "from __future__ import annotations" in code and "from star import *" in code
