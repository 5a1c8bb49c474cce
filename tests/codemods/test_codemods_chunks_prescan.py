"""The pre-scan of big files (codemods._engine.chunks.plan) answers as its plain definitions would:

- ``_facts`` finds in one walk what separate walks over the same ``ast`` find (the identifiers of
  codemods._engine.base.ast_identifiers, the names bound, the names in the arguments of the calls asked
  about, whether the piece is plain);
- the cuts found without ``tokenize`` (``_scanned_definitions``) give the plan the ``tokenize``
  scan gives, or defer to it;

on the installed deepspeed and torch sources and on code built to reach each branch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from codemods._engine import chunks
from codemods._engine.base import ast_identifiers

CALLS = frozenset({"initialize"})
KEYWORDS = frozenset({"mpu", "mesh_param"})


def reference(tree: ast.Module) -> tuple:
    """The facts, one plain ``ast.walk`` per fact (the definitions the one-walk version must equal)."""
    binds = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            binds.add(node.id)
        elif isinstance(node, ast.arg):
            binds.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            binds.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            binds.add(node.rest)
        elif isinstance(node, ast.alias):
            binds.add((node.asname or node.name).split(".")[0])
    call_names = set()
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        last = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if isinstance(node, ast.Call) and (last in CALLS or any(k.arg in KEYWORDS for k in node.keywords)):
            for arg in (*node.args, *(k.value for k in node.keywords)):
                call_names.update(n.id for n in ast.walk(arg) if isinstance(n, ast.Name))
    plain = True
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)):
            plain = False
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Attribute) and n.attr == "mpu" for t in targets for n in ast.walk(t)):
                plain = False
    defs = [s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return ast_identifiers(tree), binds, call_names, plain, defs


def one_walk(tree: ast.Module) -> tuple:
    piece = chunks.Piece("", len(tree.body))
    plain = chunks._facts(piece, tree, CALLS, KEYWORDS)
    return piece.names, piece.binds, piece.call_names, plain, piece.defs


BUILT = [
    "deepspeed.initialize(model=m, mpu=make(grid, size=n), config=c)\n",
    "engine = initialize(f(a)(b), *rest, **kw)\n",
    "run(x, mesh_param=(dp, sp))(y, mpu=z)\n",
    "initialize(mpu=a)(mpu=b)(c)\n",
    "self.mpu = mpu\n",
    "obj[key.mpu] = 1\n",
    "f(x).mpu: int = 2\n",
    "a.b.mpu += 1\n",
    "x = y.mpu\n",
    "def f():\n    global g\n    import os.path as p\n    from . import q\n",
    "class C:\n    def m(self, a, *b, c=1, **d):\n        nonlocal_ = [e for e in b]\n",
    "try:\n    pass\nexcept E as err:\n    pass\n",
    "match v:\n    case {'k': 1, **rest}:\n        pass\n    case [1, *others]:\n        pass\n    case P(x=q) as whole:\n        pass\n",
    "async def g(mpu):\n    async with a as b:\n        await initialize(mpu=mpu or fallback)\n",
    "lambda mpu=groups: initialize(mpu=lambda: hidden)\n",
]


@pytest.mark.parametrize("code", BUILT)
def test_built_statements(code):
    tree = ast.parse(code)
    assert one_walk(tree) == reference(tree)


def _sources(package: str) -> list[Path]:
    module = pytest.importorskip(package)
    return sorted(Path(module.__file__).parent.rglob("*.py"))


@pytest.mark.parametrize("package", ["deepspeed", "torch.distributed"])
def test_every_top_level_statement_of_real_sources(package):
    checked = 0
    for path in _sources(package):
        try:
            module = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for statement in module.body:
            tree = ast.Module(body=[statement], type_ignores=[])
            assert one_walk(tree) == reference(tree), (path, statement.lineno)
            checked += 1
    assert checked > 1000


def _plan(source: str, scan: bool):
    calls, keywords = CALLS, KEYWORDS
    if scan:
        return chunks.plan(source, calls, keywords)
    original = chunks._scanned_definitions
    chunks._scanned_definitions = lambda *_: chunks._FALLBACK
    try:
        return chunks.plan(source, calls, keywords)
    finally:
        chunks._scanned_definitions = original


HEADER = "import deepspeed\nfrom deepspeed.utils import groups\n\n"
SHAPES = {
    "plain": "def f():\n    return groups._get_data_parallel_rank()\n\n\ndef g(x):\n    return x\n",
    "decorated": "@dec\n@other(1,\n       2)\ndef f():\n    pass\n\n\n@dataclass\nclass C:\n  x: int = 1\n",
    "one-line first": "def f(): pass\n\n\ndef g(a,\n      b): return a\n\n\nclass C:\n\tdef m(self):\n\t\tpass\n",
    "first body decorated": "class C:\n    @property\n    def x(self):\n        return 1\n",
    "async": "async def f():\n    await g()\n\n\nasync def h(): pass\n",
    "column-0 def in a docstring": 'def f():\n    """Text\ndef not_a_def():\nclass not_a_class\n@not_a_decorator\n"""\n\n\ndef g():\n    pass\n',
    "column-0 def in brackets": "def f():\n    return [\ndef_ for def_ in x]\n\n\ndef g(): pass\n",
    "backslash after a statement": "def f():\n    return 1 \\\n\n\ndef g(): pass\n",
    "backslash before the body": "def f(): \\\n    pass\n\n\ndef g():\n  pass\n",
    "statement after a definition": "def f():\n    pass\n\n\nx = 1\n\n\ndef g(): pass\n",
    "main guard": "def f():\n    pass\n\n\nif __name__ == '__main__':\n    f()\n",
    "comments between": "def f():\n    pass\n    # indented trailer\n\n# column 0\n\n\ndef g():\n    pass\n",
    "no gap": "def f():\n    pass\ndef g():\n    pass\n",
    "form feed": "def f():\n    pass\n\x0c\n\ndef g():\n    pass\n",
    "does not parse": "def f(:\n    pass\n\n\ndef g():\n    pass\n",
}
HEADERS = {
    "imports": HEADER,
    "semicolons": "import os; import sys\nx = (1,\n     2); y = 3\n\n",
    "a block": "try:\n  import deepspeed\nexcept ImportError:\n  deepspeed = None\n\n",
    "a try-star block": "try:\n  import deepspeed\nexcept* ImportError:\n  pass\n\n",
    "a continued line": "import os, \\\n    sys\n\n",
    "a docstring": '"""Module.\n\nclass Mentioned\n"""\nimport deepspeed\n\n',
    "none": "",
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("header", HEADERS)
def test_the_scan_gives_the_tokenize_plan(shape, header):
    source = HEADERS[header] + SHAPES[shape]
    assert _plan(source, scan=True) == _plan(source, scan=False)


def test_the_scan_takes_the_common_shapes_itself():
    for shape in ("plain", "decorated", "one-line first", "first body decorated", "async", "comments between"):
        source = HEADER + SHAPES[shape]
        scanned = chunks._scanned_definitions(source, chunks._line_starts(source))
        assert scanned is not chunks._FALLBACK, shape
        assert _used(scanned) == _used(chunks._statements(source)), shape


def _used(scanned) -> tuple:
    """What plan() reads of a scan: each statement's first line, whether it starts a definition, and
    for a definition the line where the statement before ends; the indentation."""
    statements, indent = scanned
    starts = chunks._DEFINITION_STARTS
    return [(line, token in starts, before if token in starts else None) for line, token, before in statements], indent


@pytest.mark.parametrize("package", ["deepspeed", "torch.distributed"])
def test_plans_of_real_sources(package):
    planned = scanned = 0
    for path in _sources(package):
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        expected = _plan(source, scan=False)
        assert _plan(source, scan=True) == expected, path
        planned += expected is not None
        scanned += chunks._scanned_definitions(source, chunks._line_starts(source)) is not chunks._FALLBACK
    assert planned > 50 and scanned > planned
