"""The replacement advice for each legacy DeepSpeed API, in one table.

``replacements.json`` maps a legacy API (its MIGRATION.md row name, e.g.
``deepspeed.utils.groups._get_model_parallel_world_size``) to its replacement, written as the
MIGRATION.md cell (Markdown). The shim's warnings (:mod:`compat`), the codemods' ``TODOV1`` texts and
MIGRATION.md's table all read it (``tests/test_advice_table.py`` holds MIGRATION.md to it). A data
package of its own: ``compat`` and ``codemods`` both read it and neither imports the other.
"""
from __future__ import annotations

import functools
import json
import pkgutil
from typing import Mapping

__all__ = ["plain", "replacement", "table"]

_NAME = "replacements.json"


@functools.lru_cache(maxsize=None)
def table() -> Mapping[str, str]:
    """Every legacy API name → its replacement (MIGRATION.md Markdown)."""
    data = pkgutil.get_data(__name__, _NAME)  # a wheel, an editable install or a zipapp alike
    if data is None:
        raise FileNotFoundError(f"{__name__}/{_NAME} is missing from this installation")
    return dict(json.loads(data.decode("utf-8")))


def replacement(legacy_name: str) -> str:
    """The replacement of ``legacy_name`` as MIGRATION.md writes it; KeyError naming the table if none."""
    try:
        return table()[legacy_name]
    except KeyError:
        raise KeyError(f"{legacy_name!r} has no row in {__name__}/{_NAME}; add its replacement there (and to MIGRATION.md)") from None


def plain(legacy_name: str) -> str:
    """The replacement of ``legacy_name`` as plain text (a warning, a code comment): no Markdown."""
    return replacement(legacy_name).replace("`", "")
