"""The migration as one function over source code: every codemod, in order, on one file."""

from __future__ import annotations

import ast
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence, Type

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from ..rules.comm_to_torch import CommToTorchCommand
from ..rules.grid_internal import GridInternalCommand
from ..rules.grid_users import GridUsersCommand
from ..rules.groups_getters import ALL_FUNCTIONS, EXPERT_RELATED, INIT_TP, PRE_06, STATE, GroupsGettersCommand
from ..rules.initialize import InitializeCommand
from ..rules.legacy_imports import LegacyImportsCommand
from ..rules.mpu_calls import MpuCallsCommand
from ..rules.mpu_internal import BWC, MpuInternalCommand
from ..rules.topology import TopologyCommand
from . import chunks
from .base import MESH_REFS, MigrationCommand, SiteFailure, counters, find_all, identifiers
from .import_place import place_added_imports
from .legacy_names import DEFINING_MODULES
from .local_imports import keep_blank_lines, localize
from .metadata import _PRUNE, _QUERIED, prune_unless, queried_near, sharing
from .portable import fstring_ids, parse_error, requote
from .runtime import add_runtime, module_imports_deepspeed, needs_runtime
from .todo_links import collecting, spell_out
from .todo_place import place_todos
from .todo_wrap import unwrap
from .walk import fast_visits

logger = logging.getLogger(__name__)

# Order matters: the topology codemod turns grids into meshes that the initialize codemod then
# moves into the config; the mpu codemod sees what is left; imports are cleaned up last.
CODEMODS: tuple[Type[MigrationCommand], ...] = (
    GroupsGettersCommand,
    GridInternalCommand,
    GridUsersCommand,
    TopologyCommand,
    InitializeCommand,
    MpuInternalCommand,
    MpuCallsCommand,
    LegacyImportsCommand,
)

# These codemods' hooks act only at a node that names one of these identifiers (a call or reference
# whose last name is one, or an import alias of one; see ``could_be`` and ``is_mpu``) or at a star
# import, so statements without any are not visited (codemods._engine.metadata.prune_unless).
prune_unless(GroupsGettersCommand, ALL_FUNCTIONS | STATE | frozenset(PRE_06) | {"getattr"})
prune_unless(MpuInternalCommand, {"mpu", *BWC})

# Qualified names are looked up at nodes naming one of these (the codemods' identifiers): the
# scopes for them leave out functions that name none (codemods._engine.metadata.reduced_scopes; exact).
for _codemod in (*CODEMODS, CommToTorchCommand):
    queried_near(_codemod, set().union(*_codemod.IDENTIFIERS))
queried_near(MpuInternalCommand, {"mpu", *BWC})
queried_near(GridUsersCommand, {"grid", "_grid", "PipelineParallelGrid", "PipelineEngine", "isinstance", "initialize"})

# Necessary conditions beyond a codemod's own ``may_apply`` (exact, for speed): MpuInternalCommand
# acts only at a call of a ``bwc_*`` function (or an import alias of one, whose import names it)
# outside deepspeed.utils.bwc, or inside the deepspeed package at a call on ``mpu`` / ``<x>.mpu``;
# its marker "mpu" is also in words like "compute".
_NEEDS = {
    MpuInternalCommand: lambda names, module: (
        module != "deepspeed.utils.bwc"
        and (
            (
                (names is None or not names.isdisjoint({"mpu", *BWC}))
                and bool(module)
                and module.startswith("deepspeed.")
            )
            or names is None
            or not names.isdisjoint(BWC)  # the bwc helpers, in any module
        )
    ),
}


def _applies(command_class, source: str, names, module) -> bool:
    if not command_class.may_apply(source, names):
        return False
    needs = _NEEDS.get(command_class)
    return needs is None or needs(names, module)


# A codemod that fails at more statements than this in one file fails the file (left untouched).
MAX_FAILED_SITES = 50

# A file can only reach a legacy API through an import that names one of these, or through a
# relative import (inside deepspeed: ``from .. import comm as dist``).
_MARKERS = ("deepspeed", "compat", "groups", "topology")
_RELATIVE_IMPORT = re.compile(r"\bfrom\s*\.")


@dataclass
class Migration:
    """The outcome for one source: new code and per-kind counts of rewritten / TODOV1 sites."""

    code: str
    sites: Counter = field(default_factory=Counter)
    todos: Counter = field(default_factory=Counter)
    skipped: Optional[str] = None
    advice: dict = field(default_factory=dict)  # TODOV1 comment written -> its full advice (todo_links)
    # (line, why) of each statement a rule failed at, left as it is (neither rewritten nor commented)
    failures: list = field(default_factory=list)

    def spelled_out(self) -> str:
        """``code`` with each short TODOV1 comment replaced by its full advice (for reading it in one place)."""
        return spell_out(unwrap(self.code), self.advice)


def migrate_code(
    source: str,
    *,
    filename: Optional[str] = None,
    module: Optional[str] = None,
    package: Optional[str] = None,
    codemods: Sequence[Type[MigrationCommand]] = CODEMODS,
    comm_to_torch: bool = False,
    vendored: bool = False,
) -> Migration:
    """Run ``codemods`` over ``source`` (plus the opt-in ``deepspeed.comm`` → ``torch.distributed``
    codemod with ``comm_to_torch``); raises ``libcst.ParserSyntaxError`` if it does not parse.

    With ``vendored``, a ``module`` inside a ``deepspeed`` package is a copy a user's tree ships
    (codemods._engine.vendored): it gets the user-code rules (its relative imports still resolve in
    ``package``), never the runtime lines, and a copy of a module defining legacy APIs is skipped."""
    library = False
    if vendored and _in_deepspeed(module):
        if module in DEFINING_MODULES:
            return Migration(source, skipped=f"{module} (a vendored copy) defines legacy APIs")
        module, library = None, True
    if comm_to_torch and CommToTorchCommand not in codemods:
        codemods = (*[c for c in codemods if not c.CLEANUP], CommToTorchCommand, *[c for c in codemods if c.CLEANUP])
    bom = "\ufeff" if source.startswith("\ufeff") else ""  # libcst drops it; the file keeps it
    source = source[len(bom) :]
    with fast_visits(), collecting() as advice:  # fast: read-only visitors walk trees without copying them
        migration = _migrate(source, filename, module, package, codemods, library)
    migration.code = bom + migration.code
    written = unwrap(migration.code)  # (a comment wrapped over lines is looked up whole)
    migration.advice = {comment: full for comment, full in advice.items() if comment in written}
    return migration


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _migrate(source, filename, module, package, codemods, library=False) -> Migration:
    # A file no codemod can change is only checked to parse (with the fast ``ast`` parser; libcst's
    # parser then reports one that does not). Cleanup codemods need another codemod's rewrite first.
    if not any(marker in source for marker in _MARKERS) and not _RELATIVE_IMPORT.search(source):
        if not _parses(source):
            cst.parse_module(source)
        return Migration(source, skipped="no legacy import")
    if len(source) >= chunks.MIN_BYTES and module not in DEFINING_MODULES:
        try:
            pieces = _migrate_in_pieces(source, filename, module, package, codemods, library)
        except Exception:  # e.g. a group libcst cannot parse: the whole-file path reports it as it does
            logger.debug("big file migrated whole: the piecewise path failed", exc_info=True)
            pieces = None
        if pieces is not None:
            return pieces
    names = identifiers(source)
    if names is None:
        cst.parse_module(source)
    if module in DEFINING_MODULES:
        return Migration(source, skipped=f"{module} defines legacy APIs")
    if not any(not c.CLEANUP and _applies(c, source, names, module) for c in codemods):
        return Migration(source, skipped="no codemod applies")
    applied = [c for c in codemods if _applies(c, source, names, module)]
    done = _transform(source, filename, module, package, applied)
    if isinstance(done, str):
        return Migration(source, skipped=done)
    parsed, tree, sites, todos, _, failures = done
    # a tree no codemod changed is the parsed one (unchanged nodes keep their identity), whose
    # code is the source (libcst round-trips exactly): no printing
    code = source if tree is parsed else tree.code
    if (
        code != source and not library and not _in_deepspeed(module) and needs_runtime(parsed, tree, sites)
    ):  # library code never installs
        tree = add_runtime(tree)
        code = tree.code
    if code != source:
        tree = place_added_imports(parsed, _finish(parsed, tree, code, package))
        code = tree.code
        problem = parse_error(code)
        if problem is not None and parse_error(source) is None:
            raise ValueError(f"the migrated code would not parse on Python 3.10 ({problem}); file left unchanged")
    return Migration(code, +sites, +todos, failures=failures)


def _in_deepspeed(module: Optional[str]) -> bool:
    return bool(module) and (module == "deepspeed" or module.startswith("deepspeed."))


def _finish(parsed: cst.Module, tree: cst.Module, code: str, package: Optional[str]) -> cst.Module:
    """The steps after the codemods on a changed tree (whose text is ``code``): imports into the
    scopes of the ones they replace, f-string quotes for Python < 3.12, long lines' TODOV1 comments
    above their statements."""
    # a relative import is a legacy one only inside deepspeed's own package (elsewhere it is the
    # project's own: accelerate's ``from .utils import ...`` does not make deepspeed a top-level import)
    tree = keep_blank_lines(parsed, localize(parsed, tree, in_package=_in_deepspeed(package)))
    tree = requote(tree, code, fstring_ids(find_all(parsed, cst.FormattedString)))
    return place_todos(parsed, tree)


def _transform(source, filename, module, package, applied):
    """(parsed tree, migrated tree, sites, TODOV1 sites, what each codemod asked of the header's
    imports) of running ``applied`` over ``source``; or why the file is skipped."""
    parsed = tree = cst.parse_module(source)
    failures: list[tuple[int, str]] = []
    sites: Counter = Counter()
    todos: Counter = Counter()
    effects: list = []
    with sharing(applied):  # metadata resolved on a tree serves every codemod that gets that same tree
        for command_class in applied:
            if command_class.CLEANUP and not sites:
                effects.append((command_class.__name__, None))
                continue  # nothing was rewritten, so no import became unused
            excluded: set = set()
            while True:
                context = CodemodContext(filename=filename, full_module_name=module, full_package_name=package)
                command = command_class(context)
                command.excluded = excluded
                try:
                    tree = command.transform_module(tree)
                    break
                except SkipFile as skip:
                    return str(skip)
                except SiteFailure as failure:
                    # that statement is left as it is (reported); the codemod runs again on the same tree
                    if failure.position in excluded or len(excluded) >= MAX_FAILED_SITES:
                        raise
                    excluded.add(failure.position)
                    line = _source_line(parsed, failure.statement) if tree is not parsed else failure.position[0]
                    failures.append((line or failure.position[0], f"{command_class.__name__}: {failure.why}"))
            done, flagged = counters(context)
            sites.update(done)
            todos.update(flagged)
            effects.append((command_class.__name__, _import_effect(context)))
    return parsed, tree, sites, todos, effects, failures


def _source_line(parsed: cst.Module, statement) -> Optional[int]:
    """The line of ``statement`` in the source, where an earlier codemod left it as it was (the same
    node object); None otherwise."""
    if statement is None:
        return None
    from libcst.metadata import MetadataWrapper, PositionProvider

    positions = MetadataWrapper(parsed, unsafe_skip_copy=True).resolve(PositionProvider)
    position = positions.get(statement)
    return position.start.line if position is not None else None


def _import_effect(context: CodemodContext) -> tuple:
    """What a codemod asked libcst's import passes to add and remove (their order of modules and
    their sets of items: all that those passes' output depends on besides the module)."""
    added = context.scratch.get(AddImportsVisitor.CONTEXT_KEY, [])
    modules = tuple(dict.fromkeys(getattr(item, "module", None) for item in added))
    removed = frozenset(repr(item) for item in context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY, []))
    return modules, frozenset(repr(item) for item in added), removed


# Names whose sites decide something for the whole file (groups_getters: expert sites move together;
# a file building AutoTP groups or setting a default mesh): a file naming any is migrated whole.
_FILE_WIDE = EXPERT_RELATED | frozenset(INIT_TP) | {"set_default_mesh", "use_mesh"}
# Names a codemod may act at (beyond its IDENTIFIERS): a group naming none of these, nor a name the
# header imports from a legacy module, is left as it is without being parsed.
_ACTS_AT = frozenset({"mpu", "mesh_param", "grid", "_grid", "mesh_device", "comm", "groups", "deepspeed", "compat"})
_LEGACY_ROOTS = ("deepspeed", "compat", "megatron", ".")


def _triggers(plan: chunks.Plan, applied) -> set[str]:
    names = set(_ACTS_AT) | set().union(*_PRUNE.values(), *_QUERIED.values())
    for command_class in (*CODEMODS, CommToTorchCommand, *applied):
        names |= set().union(*command_class.IDENTIFIERS)
    names |= {alias for alias, name in plan.aliases.items() if name in names}
    names |= {bound for bound, full in plan.header_imports.items() if full.startswith(_LEGACY_ROOTS)}
    return names


def _whole_file(reason: str) -> None:
    logger.debug("big file migrated whole: %s", reason)
    return None


def _migrate_in_pieces(source, filename, module, package, codemods, library=False) -> Optional[Migration]:
    """The whole-file migration of a big ``source`` computed a group of top-level definitions at a
    time (codemods._engine.chunks), or None when the file's shape or what the codemods did in a group
    leaves any doubt that the whole-file path gives these bytes (then that path runs).

    The groups naming something a codemod acts at are migrated ~GROUP_BYTES of them at a time
    (those in between left out), behind a copy of the header; their code is spliced back after
    the header as every batch left it, which must be the same text, from the same requests to the
    import passes, in every batch the codemods changed. The other groups are kept byte for byte.
    The conditions (checked here and in :func:`codemods._engine.chunks.plan`) are what makes each group
    see the module it would see in the whole file: no name bound twice at the top level, no
    module-wide fact (see ``_FILE_WIDE``), no module-level name passed to ``deepspeed.initialize``,
    and every ``mesh_core`` name a group imports unbound elsewhere."""
    plan = chunks.plan(source, calls=frozenset({"initialize"}), keywords=frozenset({"mpu", "mesh_param"}))
    if plan is None:
        return _whole_file("not a header and top-level definitions (codemods._engine.chunks.plan)")
    names = set(plan.header.names).union(*(u.names for u in plan.units))
    if not any(not c.CLEANUP and _applies(c, source, names, module) for c in codemods):
        return Migration(source, skipped="no codemod applies")
    applied = [c for c in codemods if _applies(c, source, names, module)]
    defs = [name for unit in plan.units for name in unit.defs]
    top_level = set(plan.header.binds) | set(defs)
    triggers = _triggers(plan, applied)
    if (
        not names.isdisjoint(_FILE_WIDE)
        or len(set(defs)) != len(defs)
        or not plan.header.binds.isdisjoint(defs)
        or not triggers.isdisjoint(defs)
        or not triggers.isdisjoint(plan.header_code_names)
        or any(not u.call_names.isdisjoint(top_level) for u in plan.units)
    ):
        return _whole_file(
            "a file-wide fact, a name bound twice at the top level, or a module-level name passed to initialize"
        )
    legacy_bound = {b for b, full in plan.header_imports.items() if full.startswith(_LEGACY_ROOTS)}
    bound = Counter(name for unit in plan.units for name in unit.binds)  # in how many units each name is bound
    head: Optional[str] = None
    effects = None
    kept_alive = False  # an unchanged group names a legacy import (the whole file then keeps it)
    sites: Counter = Counter()
    todos: Counter = Counter()
    found = chunks.groups(plan, lambda unit: not unit.names.isdisjoint(triggers))
    pieces: list[str] = [group.text for group in found]  # a kept group's text; a migrated one's replaced below
    for batch in chunks.batches(found):
        members = [found[i] for i in batch]
        units = [i for group in members for i in group.units]
        notes: list = []
        token = MESH_REFS.set(notes)
        try:
            done = _transform(
                plan.header.text + "".join(group.text for group in members),
                filename,
                module,
                package,
                applied,
            )
        finally:
            MESH_REFS.reset(token)
        if isinstance(done, str):
            return _whole_file("a codemod skipped a group")
        parsed, tree, group_sites, group_todos, group_effects, failures = done
        if failures:  # reported at lines of the whole file
            return _whole_file("a rule failed at a site of a group")
        sites.update(group_sites)  # a site flagged again (its TODOV1 already there) changes nothing but counts
        todos.update(group_todos)
        if tree is parsed:  # unchanged here, so in the whole file too (it may keep a legacy import alive)
            kept_alive = kept_alive or any(not plan.units[i].names.isdisjoint(legacy_bound) for i in units)
            continue
        if parsed.default_indent != plan.indent:  # the indentation of the code the codemods add
            return _whole_file("a group's indentation is not the module's")
        code = tree.code
        tree = _finish(parsed, tree, code, package)
        statements = sum(group.statements for group in members)
        split = chunks.split_output(tree, statements)
        if split is None or parse_error(split[0] + split[1]) is not None:  # (their sum is tree.code: no second print)
            return _whole_file("a group's migration has another shape, or does not parse")
        if head is None:
            head, effects = split[0], group_effects
        elif (split[0], group_effects) != (head, effects):
            return _whole_file("the groups leave the header differently")
        here = Counter(name for i in units for name in plan.units[i].binds)
        if any(not foreign and bound[name] > here[name] for name, foreign in notes):
            # bound in another group: the whole file would write mesh_core.<name>
            return _whole_file("a mesh_core name a group imports is bound in another group")
        texts = chunks.split_statements(tree, split[1], [group.statements for group in members])
        if texts is None:
            return _whole_file("a group's migrated statements do not give its code")
        for index, text in zip(batch, texts):
            pieces[index] = text
    if head is None:  # no group changed, nor asked anything of the header: neither does the whole file
        return Migration(source, +sites, +todos)
    if kept_alive and any(effect is not None and effect[2] for _, effect in effects):
        return _whole_file("an unchanged group names a legacy import that the others remove")
    rest = "".join(pieces)
    code = head + rest
    if not library and not _in_deepspeed(module) and needs_runtime(source, code, sites):
        if not module_imports_deepspeed(cst.parse_module(head)):  # the lines would go into functions
            return _whole_file("the header imports no deepspeed module")
        head = chunks.header_with_runtime(head, add_runtime)
        if head is None:
            return _whole_file("the runtime lines do not go after the header")
        code = head + rest
    if not _adds_imports(plan.header.text, head):
        return Migration(code, +sites, +todos)
    placed = chunks.header_with_runtime(
        head, lambda tree: place_added_imports(cst.parse_module(plan.header.text), tree)
    )
    if placed is None:
        return _whole_file("the added imports do not go after the header")
    return Migration(placed + rest, +sites, +todos)


def _adds_imports(header: str, head: str) -> bool:
    """``head`` (the migrated ``header``) has an import line ``header`` lacks."""
    before = set(header.splitlines())
    return any(line.startswith(("import ", "from ")) and line not in before for line in head.splitlines())
