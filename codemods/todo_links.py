"""The ``# TODOV1:`` comment the codemods leave: at most :data:`MAX_COMMENT` characters, the full
advice one link away.

The comment keeps the head of each advice (cut at a clause boundary) and ends with
``see MIGRATION.md#<id>``, the section of MIGRATION.md that explains that kind of site (one id per
kind in :data:`KIND_IDS`). The full, site-specific advice is not lost: a migration collects it
(:func:`collecting`), keyed by the comment, and ``ds-migrate`` prints it beside each comment's
``file:line``.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence

import ds_mesh_advice

TODO_TAG = "TODOV1"
DOC = "MIGRATION.md"
MAX_COMMENT = 100
# site kind (the codemods' counters) -> its id: its MIGRATION.md anchor and ds-migrate --explain code
KIND_IDS: dict[str, str] = {k.kind: k.id for k in ds_mesh_advice.kinds()}
DEFAULT_ID = "todov1"
_BOUNDARIES = (": ", "; ", " (", ", ", " - ", " — ")
_MIN_HEAD = 12

# comment text -> the full advice it stands for (set around one migration by collecting())
_ADVICE: ContextVar[Optional[dict[str, list[str]]]] = ContextVar("codemods_todo_advice", default=None)


def anchor(kind: str) -> str:
    """The MIGRATION.md anchor explaining sites of ``kind``."""
    return KIND_IDS.get(kind, DEFAULT_ID)


def shorten(message: str, room: int) -> str:
    """``message``, or its head: cut at the last clause boundary that fits ``room`` characters
    when that keeps most of them, else at a word, with an ellipsis."""
    if len(message) <= room:
        return message
    cuts = [i for sep in _BOUNDARIES for i in _positions(message, sep) if _MIN_HEAD <= i <= room]
    if cuts and max(cuts) >= 0.6 * room:  # a clause that keeps most of the room
        return message[: max(cuts)]
    head = message[: max(room - 1, 1)]
    space = head.rfind(" ")
    return (head[:space] if space >= _MIN_HEAD else head).rstrip(" ,;:(") + "…"


def _positions(text: str, sep: str) -> Iterator[int]:
    start = text.find(sep)
    while start != -1:
        yield start
        start = text.find(sep, start + 1)


def todo_comment(entries: Sequence[tuple[str, str]]) -> str:
    """The ``# TODOV1: <head>; see MIGRATION.md#<id>`` comment for ``(kind, advice)`` entries
    (their distinct advices, in order); records the full advice for :func:`collecting`."""
    messages = list(dict.fromkeys(message for _, message in entries))
    ids = list(dict.fromkeys(anchor(kind) for kind, _ in entries))
    link = f"; see {DOC}#" + ", #".join(ids)
    prefix = f"# {TODO_TAG}: "
    room = MAX_COMMENT - len(prefix) - len(link)
    joined = "; ".join(messages)
    if len(joined) <= room:
        body = joined
    else:
        more = f" (+{len(messages) - 1} more)" if len(messages) > 1 else ""
        body = shorten(messages[0], room - len(more)) + more
    text = prefix + body + link
    advice = _ADVICE.get()
    if advice is not None:
        advice.setdefault(text, [])
        advice[text] += [m for m in messages if m not in advice[text]]
    return text


def spell_out(code: str, advice: dict[str, list[str]]) -> str:
    """``code`` with each short comment of ``advice`` replaced by its full advice."""
    for comment, full in advice.items():
        code = code.replace(comment, f"# {TODO_TAG}: " + "; ".join(full))
    return code


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, list[str]]]:
    """Collect ``{comment: [full advice, ...]}`` for the comments written inside the block."""
    advice: dict[str, list[str]] = {}
    token = _ADVICE.set(advice)
    try:
        yield advice
    finally:
        _ADVICE.reset(token)
