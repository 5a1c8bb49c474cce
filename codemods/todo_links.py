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
import re
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence

TODO_TAG = "TODOV1"
DOC = "MIGRATION.md"
MAX_COMMENT = 100
# site kind (the codemods' counters) -> its anchor in MIGRATION.md ("<a id=...>" there)
KIND_IDS: dict[str, str] = {
    "groups getter": "todov1-groups",
    "grid method/attribute": "todov1-grid-use",
    "engine grid": "todov1-engine-grid",
    "grid construction": "todov1-grid",
    "pipeline topology": "todov1-topology",
    "initialize mesh_param": "todov1-mesh-param",
    "initialize mpu": "todov1-initialize-mpu",
    "mpu call": "todov1-mpu-call",
    "mpu/bwc call": "todov1-mpu-internal",
    "deepspeed.comm call": "todov1-comm",
}
DEFAULT_ID = "todov1"
_BOUNDARIES = (": ", "; ", " (", ", ", " - ", " — ")
_MIN_HEAD = 12

# comment text -> the full advice it stands for (set around one migration by collecting())
_ADVICE: ContextVar[Optional[dict[str, list[str]]]] = ContextVar("codemods_todo_advice", default=None)


def anchor(kind: str) -> str:
    """The MIGRATION.md anchor explaining sites of ``kind``."""
    return KIND_IDS.get(kind, DEFAULT_ID)


_OPEN, _CLOSE = "([{", ")]}"
# a comment at the end of a line of quoted code (dropped with its line break)
_LINE_COMMENT = re.compile(r"(?:(?<=\s)|(?<=[(\[{,]))#[^\r\n]*(?=\r\n|\r|\n)")
_LINE_BREAK = re.compile(r"[ \t\f]*(?:\r\n|\r|\n)[ \t\f]*")


def one_line(message: str) -> str:
    """``message`` on one line: code quoted in it (a call written across lines) loses its end-of-line
    comments and its line breaks (with the indentation after them): nothing next to a bracket, a
    space elsewhere. A comment cannot hold a line break."""
    message = _LINE_COMMENT.sub("", message)
    out: list[str] = []
    pos = 0
    for match in _LINE_BREAK.finditer(message):
        out.append(message[pos:match.start()])
        before, after = "".join(out)[-1:], message[match.end():match.end() + 1]
        if before in _OPEN or after in _CLOSE or not before or not after:
            joiner = ""
        else:
            joiner = " "
        if after in _CLOSE and before == ",":  # a trailing comma before the closing bracket
            out[-1] = out[-1][:-1]
        out.append(joiner)
        pos = match.end()
    out.append(message[pos:])
    return "".join(out)


def _depths(text: str) -> list[int]:
    """The bracket depth (outside backtick quotes: 0 only outside every code span) before each
    character of ``text`` and after the last one."""
    depths, depth, quoted = [], 0, False
    for char in text:
        depths.append(1 if quoted else depth)
        if char == "`":
            quoted = not quoted
        elif char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth = max(depth - 1, 0)
    depths.append(1 if quoted else depth)
    return depths


def _elide_code_at(message: str, depths: list[int], room: int) -> Optional[str]:
    """``message`` with the arguments of the bracketed code that crosses character ``room`` replaced
    by ``…`` (``f(a, b)`` → ``f(…)``), when that call starts early enough to keep its name; else None."""
    if depths[room] == 0:
        return None
    start = max(i for i in range(room + 1) if depths[i] == 0)  # the opening bracket
    if message[start] not in _OPEN or start < _MIN_HEAD:
        return None
    end = next((i for i in range(start + 1, len(message)) if depths[i + 1] == 0), None)
    if end is None or end - start <= 2:
        return None
    return message[: start + 1] + "…" + message[end:]


def shorten(message: str, room: int) -> str:
    """``message``, or its head: cut at the last clause boundary that fits ``room`` characters
    when that keeps most of them, else at a word, with an ellipsis; never inside code (brackets or
    a backtick quote), so a call is quoted whole or not at all."""
    if len(message) <= room:
        return message
    depths = _depths(message)
    cuts = [
        i for sep in _BOUNDARIES for i in _positions(message, sep) if _MIN_HEAD <= i <= room and depths[i] == 0
    ]
    if cuts and max(cuts) >= 0.6 * room:  # a clause that keeps most of the room
        return message[: max(cuts)]
    elided = _elide_code_at(message, depths, room)
    if elided is not None:  # the call that crosses the cut quoted as name(…)
        return shorten(elided, room)
    limit = max(room - 1, 1)
    spaces = [i for i in _positions(message[:limit + 1], " ") if i <= limit and depths[i] == 0]
    good = [i for i in spaces if i >= _MIN_HEAD]
    if good:
        head = message[: good[-1]]
    elif depths[limit] == 0 and " " not in message[:limit]:
        head = message[:limit]  # one long word outside code
    elif spaces:
        head = message[: spaces[-1]]
    else:
        head = ""
    return head.rstrip(" ,;:(") + "…"


def _positions(text: str, sep: str) -> Iterator[int]:
    start = text.find(sep)
    while start != -1:
        yield start
        start = text.find(sep, start + 1)


def todo_comment(entries: Sequence[tuple[str, str]]) -> str:
    """The ``# TODOV1: <head>; see MIGRATION.md#<id>`` comment for ``(kind, advice)`` entries
    (their distinct advices, in order); records the full advice for :func:`collecting`."""
    messages = list(dict.fromkeys(one_line(message) for _, message in entries))
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
