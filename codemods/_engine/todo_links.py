"""The ``# TODOV1:`` comment the codemods leave: at most :data:`MAX_COMMENT` characters, never cut,
naming what to write, with the command that prints the rest.

A comment reads ``# TODOV1: <next step>; ds-migrate --explain <code>``. The next step is the site's
own advice when it fits; else, where the advice is the catalog's for the legacy API it names, that
API's next step from the catalog (:mod:`ds_mesh_advice`, the one place advice is written: the shim's
warning says the same); else the clause of the advice that says what to write (``use …``,
``write …``, ``pass …``); else the API's or its kind's next step. ``<code>`` is
that API's catalog code when it fits, else the kind's (``groups``, ``grid-use``, ...):
``ds-migrate --explain <code>`` prints the catalog row or what the kind means, from the installed
package. The full, site-specific advice is not lost: a migration collects it (:func:`collecting`),
keyed by the comment, and ``ds-migrate`` prints it beside each comment's ``file:line``.
"""

from __future__ import annotations

import contextlib
import re
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence

import ds_mesh_advice

TODO_TAG = "TODOV1"
MAX_COMMENT = 100
EXPLAIN = "ds-migrate --explain"
LINK = f"; {EXPLAIN} "
# site kind (the codemods' counters) -> its id: its MIGRATION.md anchor; ds-migrate --explain takes its code
KIND_IDS: dict[str, str] = {k.kind: k.id for k in ds_mesh_advice.kinds()}
_KINDS = {k.kind: k for k in ds_mesh_advice.kinds()}
DEFAULT_KIND = "groups getter"
# the words a next step starts with
NEXT_VERBS = ds_mesh_advice.NEXT_VERBS
_VERB = re.compile(r"(?:then |or |and )?(?:" + "|".join(NEXT_VERBS) + r")\b")
# how a message names the legacy API it is about: groups.<fn>, <x>.grid.<m> / grid.<m>, mpu.<m>, ...
_API_PATTERNS = (
    (re.compile(r"^groups\.(\w+)"), "deepspeed.utils.groups.{}"),
    (re.compile(r"^(?:[\w.]*\.)?_?grid\.(\w+)"), "deepspeed.runtime.pipe.topology.PipelineParallelGrid.{}"),
    (re.compile(r"^PipelineParallelGrid\b()"), "deepspeed.runtime.pipe.topology.PipelineParallelGrid"),
    (re.compile(r"^(?:[\w.]*\.)?mpu\.(\w+)\("), "mpu.{}"),
)

# comment text -> the full advice it stands for (set around one migration by collecting())
_ADVICE: ContextVar[Optional[dict[str, list[str]]]] = ContextVar("codemods_todo_advice", default=None)


def anchor(kind: str) -> str:
    """The MIGRATION.md anchor explaining sites of ``kind``."""
    return KIND_IDS.get(kind, KIND_IDS[DEFAULT_KIND])


def _kind(kind: str) -> ds_mesh_advice.Kind:
    return _KINDS.get(kind, _KINDS[DEFAULT_KIND])


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
        out.append(message[pos : match.start()])
        before, after = "".join(out)[-1:], message[match.end() : match.end() + 1]
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


def api_row(message: str) -> Optional[ds_mesh_advice.Row]:
    """The catalog row of the legacy API ``message`` is about (None when it names none)."""
    for pattern, template in _API_PATTERNS:
        match = pattern.match(message)
        if match:
            try:
                return ds_mesh_advice.row(template.format(*match.groups()))
            except KeyError:
                return None
    return None


def clauses(message: str) -> list[str]:
    """``message`` split at its top-level ``; `` / ``: `` / ``, `` (never inside brackets or quotes,
    nor after a quoted key: ``"mesh": {...}``)."""
    out, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(message):
        ch = message[i]
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([{":
            depth += 1
        elif not quoted and ch in ")]}":
            depth = max(depth - 1, 0)
        elif (
            not quoted
            and depth == 0
            and message.startswith((": ", "; ", ", "), i)
            and not (message[i] == ":" and message[i - 1 : i] == '"')
        ):  # a JSON key's colon
            out.append(message[start:i])
            start = i + 2
            i += 1
        i += 1
    out.append(message[start:])
    return [c.strip() for c in out if c.strip()]


def next_steps(message: str) -> list[str]:
    """The clauses of ``message`` that say what to write (start with one of :data:`NEXT_VERBS`;
    a leading "or" / "then" / "and" dropped)."""
    return [re.sub(r"^(?:then|or|and) ", "", c) for c in clauses(message) if _VERB.match(c)]


def has_next_step(text: str) -> bool:
    """Whether ``text`` says what to write: a clause starting with one of :data:`NEXT_VERBS`."""
    return bool(next_steps(text))


# a clause's subject: the code it is about (``mpu.get_data_parallel_rank()``, ``groups.f``), named by the site
_SUBJECT = re.compile(r"^[\w.]+(?:\([^()]*\))?\s+")


def _site_reasons(message: str, row: Optional[ds_mesh_advice.Row]) -> list[str]:
    """Why this site needs a change of its own (``takes no arguments``): the clauses of ``message``
    before its first next step, whole and without their subject, when the message is the site's own
    (not the catalog's advice for the API). A reason changes what to write, so it goes with the step."""
    if row is not None and (row.advice in message or row.next_step in message):
        return []
    reasons = []
    for clause in clauses(message):
        if _VERB.match(clause):
            break
        reasons.append(clause)
    if not reasons:
        return []
    reason = "; ".join(reasons)
    return list(dict.fromkeys([reason, _SUBJECT.sub("", reason, count=1)]))


# a layout call the advice names with this site's own arguments (not the catalog's P, D, T)
_LAYOUT_CALL = re.compile(r"(?:mesh_core\.)?(?:pipeline_topology|DeepSpeedDeviceMesh\.build)\((?:[^()]|\([^()]*\))*\)")
_PLACEHOLDER = re.compile(r"=\s*[A-Z]\b|=\s*[,)]")


def concrete_calls(message: str) -> list[str]:
    """The layout calls ``message`` names with real arguments, each also without ``mesh_core.`` (shorter)."""
    calls = [c for c in _LAYOUT_CALL.findall(message) if not _PLACEHOLDER.search(c)]
    short = [c.removeprefix("mesh_core.") for c in calls]
    return list(dict.fromkeys([*calls, *short, *(_elided(c) for c in short)]))


def _elided(call: str) -> str:
    """``call`` with each long argument value written ``...`` (the full advice has it)."""
    head, _, args = call.partition("(")
    parts = [p.strip() for p in clauses_of(args[:-1])]
    return (
        head
        + "("
        + ", ".join(p if len(p.partition("=")[2]) <= 12 else p.partition("=")[0] + "=..." for p in parts)
        + ")"
    )


def clauses_of(args: str) -> list[str]:
    """``args`` split at its top-level commas."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(args[start:i])
            start = i + 1
    return out + [args[start:]]


_OWN_POINTER = re.compile(r"\s*\(" + re.escape(EXPLAIN) + r" [\w.-]+\)")


def todo_comment(entries: Sequence[tuple[str, str]]) -> str:
    """The ``# TODOV1: <next step>; ds-migrate --explain <code>`` comment for ``(kind, advice)``
    entries (their distinct advices, in order); records the full advice for :func:`collecting`."""
    # a message's own "(ds-migrate --explain x)" would repeat the pointer the comment ends with
    messages = list(dict.fromkeys(_OWN_POINTER.sub("", one_line(message)) for _, message in entries))
    kind = _kind(entries[0][0]) if entries else _kind(DEFAULT_KIND)
    row = api_row(messages[0]) if messages else None
    more = f" (+{len(messages) - 1} more)" if len(messages) > 1 else ""
    bodies = ["; ".join(messages)] if has_next_step("; ".join(messages)) else []
    if messages:
        bodies += [messages[0] + more] if has_next_step(messages[0]) else []
        if row is not None and (row.advice in messages[0] or row.next_step in messages[0]):  # as the shim says
            bodies.append(row.next_step + more)
        bodies += [
            reason + "; " + step + more
            for reason in _site_reasons(messages[0], row)
            for step in next_steps(messages[0])
        ]
        bodies += [step + more for step in next_steps(messages[0])]
        bodies += [f"use {call}" + more for call in concrete_calls(messages[0])]
    if row is not None:
        bodies.append(row.next_step + more)
    bodies.append(kind.short + more)
    codes = ([row.code] if row is not None else []) + [kind.code]
    prefix = f"# {TODO_TAG}: "
    texts = [prefix + body + LINK + code for body in bodies for code in codes]
    advice = _ADVICE.get()
    if advice is not None and messages:  # two sites with other advice get two comments (the listing keys on it)
        head = clauses(messages[0])[0]
        texts += [prefix + f"{head}: {body}" + LINK + code for body in bodies for code in codes]
    fitting = [t for t in texts if len(t) <= MAX_COMMENT]
    if advice is not None and messages:
        fitting = [t for t in fitting if advice.get(t) in (None, messages)] or fitting
    text = fitting[0] if fitting else prefix + kind.short + LINK + kind.code
    if advice is not None:
        advice.setdefault(text, [])
        advice[text] += [m for m in messages if m not in advice[text]]
    return text


def explain_command(comment: str) -> str:
    """``ds-migrate --explain <code>`` as a comment names it."""
    return EXPLAIN + " " + comment.rsplit(LINK, 1)[-1]


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
