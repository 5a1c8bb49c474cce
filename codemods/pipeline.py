"""The migration as one function over source code: every codemod, in order, on one file."""
from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence, Type

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile

from .base import MigrationCommand, counters, find_all, identifiers
from .comm_to_torch import CommToTorchCommand
from .legacy_names import DEFINING_MODULES
from .metadata import prune_unless, queried_near, sharing
from .grid_internal import GridInternalCommand
from .grid_users import GridUsersCommand
from .groups_getters import ALL_FUNCTIONS, STATE, GroupsGettersCommand
from .initialize import InitializeCommand
from .legacy_imports import LegacyImportsCommand
from .mpu_calls import MpuCallsCommand
from .mpu_internal import BWC, MpuInternalCommand
from .local_imports import localize
from .portable import fstring_ids, parse_error, requote
from .runtime import add_runtime, needs_runtime
from .topology import TopologyCommand

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
# import, so statements without any are not visited (codemods.metadata.prune_unless).
prune_unless(GroupsGettersCommand, ALL_FUNCTIONS | STATE | {"getattr"})
prune_unless(MpuInternalCommand, {"mpu", *BWC})

# Qualified names are looked up at nodes naming one of these (the codemods' identifiers): the
# scopes for them leave out functions that name none (codemods.metadata.reduced_scopes; exact).
for _codemod in (*CODEMODS, CommToTorchCommand):
    queried_near(_codemod, set().union(*_codemod.IDENTIFIERS))
queried_near(MpuInternalCommand, {"mpu", *BWC})
queried_near(GridUsersCommand, {"grid", "_grid", "PipelineParallelGrid", "PipelineEngine", "isinstance", "initialize"})

# Necessary conditions beyond a codemod's own ``may_apply`` (exact, for speed): MpuInternalCommand
# acts only at a call of a ``bwc_*`` function (or an import alias of one, whose import names it)
# outside deepspeed.utils.bwc, or inside the deepspeed package at a call on ``mpu`` / ``<x>.mpu``;
# its marker "mpu" is also in words like "compute".
_NEEDS = {
    MpuInternalCommand: lambda names, module: module != "deepspeed.utils.bwc" and (
        (
            (names is None or not names.isdisjoint({"mpu", *BWC}))
            and bool(module) and module.startswith("deepspeed.")
        )
        or names is None or not names.isdisjoint(BWC)  # the bwc helpers, in any module
    ),
}


def _applies(command_class, source: str, names, module) -> bool:
    if not command_class.may_apply(source, names):
        return False
    needs = _NEEDS.get(command_class)
    return needs is None or needs(names, module)


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


def migrate_code(
    source: str,
    *,
    filename: Optional[str] = None,
    module: Optional[str] = None,
    package: Optional[str] = None,
    codemods: Sequence[Type[MigrationCommand]] = CODEMODS,
    comm_to_torch: bool = False,
) -> Migration:
    """Run ``codemods`` over ``source`` (plus the opt-in ``deepspeed.comm`` → ``torch.distributed``
    codemod with ``comm_to_torch``); raises ``libcst.ParserSyntaxError`` if it does not parse."""
    if comm_to_torch and CommToTorchCommand not in codemods:
        codemods = (*[c for c in codemods if not c.CLEANUP], CommToTorchCommand, *[c for c in codemods if c.CLEANUP])
    bom = "\ufeff" if source.startswith("\ufeff") else ""  # libcst drops it; the file keeps it
    source = source[len(bom):]
    migration = _migrate(source, filename, module, package, codemods)
    migration.code = bom + migration.code
    return migration


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _migrate(source, filename, module, package, codemods) -> Migration:
    # A file no codemod can change is only checked to parse (with the fast ``ast`` parser; libcst's
    # parser then reports one that does not). Cleanup codemods need another codemod's rewrite first.
    if not any(marker in source for marker in _MARKERS) and not _RELATIVE_IMPORT.search(source):
        if not _parses(source):
            cst.parse_module(source)
        return Migration(source, skipped="no legacy import")
    names = identifiers(source)
    if names is None:
        cst.parse_module(source)
    if module in DEFINING_MODULES:
        return Migration(source, skipped=f"{module} defines legacy APIs")
    if not any(not c.CLEANUP and _applies(c, source, names, module) for c in codemods):
        return Migration(source, skipped="no codemod applies")
    parsed = tree = cst.parse_module(source)
    sites: Counter = Counter()
    todos: Counter = Counter()
    with sharing(codemods):  # metadata resolved on a tree serves every codemod that gets that same tree
        for command_class in codemods:
            if not _applies(command_class, source, names, module):
                continue
            if command_class.CLEANUP and not sites:
                continue  # nothing was rewritten, so no import became unused
            context = CodemodContext(filename=filename, full_module_name=module, full_package_name=package)
            try:
                tree = command_class(context).transform_module(tree)
            except SkipFile as skip:
                return Migration(source, skipped=str(skip))
            done, flagged = counters(context)
            sites.update(done)
            todos.update(flagged)
    # a tree no codemod changed is the parsed one (unchanged nodes keep their identity), whose
    # code is the source (libcst round-trips exactly): no printing
    code = source if tree is parsed else tree.code
    in_deepspeed = bool(module) and (module == "deepspeed" or module.startswith("deepspeed."))
    if code != source and not in_deepspeed and needs_runtime(source, code, sites):  # library code never installs
        tree = add_runtime(tree)
        code = tree.code
    if code != source:
        tree = localize(parsed, tree, in_package=bool(package))
        tree = requote(tree, code, fstring_ids(find_all(parsed, cst.FormattedString)))
        code = tree.code
        problem = parse_error(code)
        if problem is not None and parse_error(source) is None:
            raise ValueError(f"the migrated code would not parse on Python 3.10 ({problem}); file left unchanged")
    return Migration(code, +sites, +todos)
