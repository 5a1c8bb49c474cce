"""A ``# TODOV1:`` comment on its own line, wrapped so that each of its lines, indentation included,
stays within :data:`~codemods._engine.todo_links.MAX_COMMENT` characters.

The comment's words go on ``#   `` continuation lines (at the comment's indentation) as they fill
the line; a word is never cut, and the closing ``ds-migrate --explain <code>`` stays whole on one
line where it fits one. (A line can pass the limit only where one word is longer than the room
left by its indentation.) :func:`unwrap` joins such lines back into the one comment the migration wrote (what its
listing and its full advice are keyed on).
"""

from __future__ import annotations

import re

from .todo_links import EXPLAIN, MAX_COMMENT, TODO_TAG

CONTINUATION = "#   "
_TAG = f"# {TODO_TAG}:"
# a TODOV1 comment on its own line, then its continuation lines (same indentation)
_WRAPPED = re.compile(rf"^([ \t]*)({re.escape(_TAG)}[^\r\n]*)((?:\r?\n\1{re.escape(CONTINUATION)}[^\r\n]*)+)$", re.M)
_CONTINUED = re.compile(rf"\r?\n[ \t]*{re.escape(CONTINUATION)}")


def wrap(text: str, indent: int, width: int = MAX_COMMENT) -> list[str]:
    """The lines to write ``text`` (a ``# TODOV1:`` comment) on, indented by ``indent`` characters:
    ``[text]`` when it fits in ``width`` (or is not such a comment), else its words spread over
    continuation lines (a word longer than a line stands alone on its line)."""
    if indent + len(text) <= width or not text.startswith(_TAG + " "):
        return [text]
    words = text[len(_TAG) + 1 :].split(" ")
    pointer = EXPLAIN.split(" ")
    n = len(pointer)
    whole = " ".join(words[-n - 1 :])
    if len(words) > n and words[-n - 1 : -1] == pointer and indent + len(CONTINUATION + whole) <= width:
        words = [*words[: -n - 1], whole]  # "ds-migrate --explain <code>" stays whole where it fits a line
    lines: list[str] = []
    line = _TAG + " " + words[0]
    for word in words[1:]:
        if indent + len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.append(line)
            line = CONTINUATION + word
    lines.append(line)
    if any(not word for word in words) or _join(lines) != text:  # (runs of spaces would not read back)
        return [text]
    return lines


def _join(lines: list[str]) -> str:
    return " ".join([lines[0], *(line[len(CONTINUATION) :] for line in lines[1:])])


def unwrap(code: str) -> str:
    """``code`` with each wrapped ``# TODOV1:`` comment back on one line."""
    if CONTINUATION not in code:
        return code
    return _WRAPPED.sub(lambda m: m[1] + m[2] + _CONTINUED.sub(" ", m[3]), code)


def numbered(lines: list[str]) -> list[tuple[int, str]]:
    """``(one-based number, line)`` of ``lines`` (each with its line break), a wrapped ``# TODOV1:``
    comment joined into its first line (numbered as that line)."""
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line, number = lines[i], i + 1
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        i += 1
        if line.lstrip(" \t").startswith(_TAG):
            while i < len(lines) and lines[i].startswith(indent + CONTINUATION):
                line = line.rstrip("\r\n") + " " + lines[i][len(indent + CONTINUATION) :]
                i += 1
        out.append((number, line))
    return out
