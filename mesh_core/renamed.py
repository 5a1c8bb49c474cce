"""One-time deprecation warnings for mesh API spellings that were renamed.

Each old spelling warns once per process with a :class:`MeshAPIDeprecationWarning` whose message
starts with ``TODOV1:`` and names what to write instead; it keeps working. Standard ``warnings``
filters silence it or turn it into an error.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Optional

__all__ = ["MeshAPIDeprecationWarning", "RENAMED_GET_RANK", "TorchGetRank", "warn_renamed"]

# a mesh's get_rank(dims) (a coordinate) is get_local_rank(dims), torch's name; get_rank() is the global rank
RENAMED_GET_RANK = (
    "<mesh>.get_rank(dims)",
    "<mesh>.get_local_rank(dims)",
    "get_rank() is the global rank, as in torch's DeviceMesh",
)


class MeshAPIDeprecationWarning(DeprecationWarning):
    """An old spelling of a mesh API was used; the message names the new one."""


_warned: set[str] = set()
_lock = threading.Lock()


def warn_renamed(old: str, new: str, why: str = "", *, stacklevel: int = 3) -> None:
    """Warn once per process that ``old`` is now spelled ``new`` (``why``: one clause of reason)."""
    if old in _warned:
        return
    with _lock:
        if old in _warned:
            return
        _warned.add(old)
    reason = f" ({why})" if why else ""
    warnings.warn(f"TODOV1: {old} is deprecated{reason}; use {new}", MeshAPIDeprecationWarning, stacklevel=stacklevel)


class TorchGetRank:
    """``get_rank`` as torch's ``DeviceMesh`` means it, for a mesh (or a mesh view) with ``rank`` and
    ``get_local_rank(dims)``: ``get_rank()`` is the global rank; ``get_rank(dims)``, the old
    spelling of ``get_local_rank(dims)``, still answers it with a one-time deprecation."""

    rank: int

    def get_local_rank(self, dims: Any) -> int:  # pragma: no cover (every user defines it)
        raise NotImplementedError

    def get_rank(self, dims: Optional[Any] = None) -> int:
        """This process's global rank (as torch ``DeviceMesh.get_rank()``)."""
        if dims is None:
            return self.rank
        warn_renamed(*RENAMED_GET_RANK)
        return self.get_local_rank(dims)
