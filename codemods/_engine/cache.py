"""Which file contents are already migrated (fixed points of the migration), so that ``--check`` and
a rerun skip them without parsing.

The migration is idempotent (tested), so a file whose content is the output of a migration, or a
file the migration left unchanged, needs no work while the codemods are the same. The rules also
depend on where the file lives (its dotted module and package: DeepSpeed-internal rules, modules that
define legacy APIs, relative imports), so a key is a hash of the content *and* that place, and the
same bytes elsewhere are migrated afresh. The cache is a set of such keys per *fingerprint*: a hash of the codemods' own source and the options that change
the output (``--comm-to-torch``). It lives in ``$CODEMODS_CACHE_DIR`` (default
``~/.cache/ds-mesh-codemods``); ``--no-cache`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

_PACKAGE = Path(__file__).resolve().parents[1]  # codemods/: the engine and the rules
_MAX_ENTRIES = 200_000


def content_hash(text: str, module: Optional[str] = None, package: Optional[str] = None, vendored: bool = False) -> str:
    """The cache key of ``text`` migrated as ``module`` in ``package`` (None: outside any package),
    ``vendored``: in a DeepSpeed copy a tree ships (codemods._engine.vendored)."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    digest.update(f"\0{module or ''}\0{package or ''}".encode())
    if vendored:  # (keys of every other file as before)
        digest.update(b"\0vendored")
    return digest.hexdigest()[:32]


def fingerprint(comm_to_torch: bool) -> str:
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    digest.update(b"comm_to_torch" if comm_to_torch else b"")
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("CODEMODS_CACHE_DIR") or Path.home() / ".cache" / "ds-mesh-codemods")


class FixedPoints:
    """The cached content hashes for one fingerprint."""

    def __init__(self, comm_to_torch: bool = False, directory: Optional[Path] = None) -> None:
        self.path = (directory or cache_dir()) / f"fixed-{fingerprint(comm_to_torch)}.json"
        self.known: dict[str, dict[str, int]] = {}  # digest -> the TODOV1 sites it carries, by kind
        self.dirty = False
        try:
            loaded = json.loads(self.path.read_text())
            if isinstance(loaded, dict):
                self.known = loaded
        except (OSError, ValueError):
            pass

    def get(self, digest: str) -> Optional[dict[str, int]]:
        return self.known.get(digest)

    def add(self, digest: str, todos: dict[str, int]) -> None:
        if digest not in self.known:
            self.known[digest] = dict(todos)
            self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            entries = dict(list(self.known.items())[-_MAX_ENTRIES:])
            fd, tmp = tempfile.mkstemp(prefix=".fixed.", dir=self.path.parent)
            with os.fdopen(fd, "w") as fh:
                json.dump(entries, fh)
            os.replace(tmp, self.path)
        except OSError as err:  # a cache that cannot be written only costs time
            logger.warning("cannot write the codemods cache %s: %s", self.path, err)
