"""Reading migrated code whatever line its ``# TODOV1:`` comments stand on (a comment is placed above
its statement when the statement's line would grow past 100 characters, wrapped where its indentation
would take it past 100)."""

from __future__ import annotations

import re

from codemods._engine.todo_wrap import unwrap

# a TODOV1 comment on its own line, then the first line of its statement
_ABOVE = re.compile(r"^([ \t]*)(# TODOV1: [^\r\n]*)\r?\n[ \t]*([^\r\n]*?)(  (#[^\r\n]*))?$", re.M)


def inline(code: str) -> str:
    """``code`` with each TODOV1 comment above a statement put back at the end of the statement's
    first line (after the line's own comment; a comment wrapped over lines joined first): the text the
    assertions were written for."""
    code = unwrap(code)
    return _ABOVE.sub(lambda m: f"{m[1]}{m[3]}{'  ' + m[5] if m[5] else ''}  {m[2]}", code)
