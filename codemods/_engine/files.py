"""Which files a migration run covers, and the module name of each (for relative imports)."""

from __future__ import annotations

import codecs
import fnmatch
import io
import os
import tokenize
from pathlib import Path, PurePosixPath
from typing import Iterable, Optional, Sequence

SKIPPED_DIRS = {"__pycache__", "node_modules", "site-packages"}


def _matches(path: Path, root: Path, patterns: Sequence[str]) -> bool:
    relative = PurePosixPath(path.relative_to(root).as_posix() if root in path.parents else path.name)
    directories = relative.parts[:-1]
    return any(
        fnmatch.fnmatch(str(relative), p) or relative.match(p) or any(fnmatch.fnmatch(d, p) for d in directories)
        for p in patterns
    )


def discover(
    paths: Iterable[str | os.PathLike],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> list[Path]:
    """Python files under ``paths`` (files or directories), filtered by glob patterns.

    A pattern matches a file's path relative to the directory given (``fnmatch``), or its tail
    (``PurePath.match``: ``"sub/*.py"``, ``"*_test.py"``), or a directory below it (``"tests"``).
    Hidden directories (``.git``, ``.venv``) and ``__pycache__`` are not entered.
    """
    found: dict[Path, None] = {}
    for raw in paths:
        root = Path(raw)
        if not root.exists():
            raise FileNotFoundError(f"path {str(raw)!r} does not exist; pass existing files or directories")
        if root.is_file():
            candidates: Iterable[Path] = [root]
            base = root.parent
        else:
            candidates = _walk(root)
            base = root
        for path in candidates:
            if include and not _matches(path, base, include):
                continue
            if exclude and _matches(path, base, exclude):
                continue
            found[path] = None
    return list(found)


def _walk(root: Path) -> Iterable[Path]:
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory) / name


def module_and_package(path: Path) -> tuple[Optional[str], Optional[str]]:
    """(dotted module name, package name) of ``path``, from the ``__init__.py`` files above it."""
    path = path.resolve()
    parts = [] if path.name == "__init__.py" else [path.stem]
    directory = path.parent
    while (directory / "__init__.py").exists():
        parts.insert(0, directory.name)
        directory = directory.parent
    if not parts:
        return None, None
    module = ".".join(parts)
    package = module if path.name == "__init__.py" else ".".join(parts[:-1])
    return module, package


def read_source(path: str | os.PathLike) -> tuple[str, str]:
    """(text, encoding) of a Python file: its PEP 263 ``coding`` declaration (or UTF-8), with line
    endings kept and a UTF-8 BOM kept as the text's first character. Raises ``UnicodeDecodeError``
    (or ``SyntaxError`` for an unknown encoding name) for a file that is not in its encoding."""
    with open(path, "rb") as fh:
        data = fh.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    encoding = "utf-8" if encoding == "utf-8-sig" else codecs.lookup(encoding).name
    return data.decode(encoding), encoding
