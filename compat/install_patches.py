"""A reversible record of attribute patches, including the copies ``from ... import`` made.

``from module import name`` copies a binding into the importing module, so patching the defining
module alone leaves stale copies behind. :class:`PatchSet` remembers every ``(owner, name,
original, replacement)`` it applied and can re-point the copies found in already imported modules
of a package, in both directions (install and restore).
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

logger = logging.getLogger(__name__)


@dataclass
class Patch:
    owner: Any
    name: str
    original: Any
    replacement: Any


class PatchSet:
    """Patches applied so far, restorable in reverse order."""

    def __init__(self, packages: Iterable[str]) -> None:
        self.packages = tuple(packages)
        self.patches: list[Patch] = []
        self.module_classes: list[tuple[types.ModuleType, type]] = []
        self.done: set[str] = set()  # keys of patch groups already applied

    def replace(self, owner: Any, name: str, replacement: Any) -> None:
        """Set ``owner.name`` to ``replacement``, remembering the original (own attribute only)."""
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, replacement)
        self.patches.append(Patch(owner, name, original, replacement))

    def swap_module_class(self, module: types.ModuleType, cls: type) -> None:
        """Give ``module`` a ``ModuleType`` subclass (e.g. one with properties)."""
        self.module_classes.append((module, module.__class__))
        module.__class__ = cls

    def rebind_copies(self) -> int:
        """Point copies of patched originals in imported package modules at their replacements."""
        return self._rebind({id(p.original): p for p in self.patches}, lambda p: p.original, lambda p: p.replacement)

    def restore(self) -> None:
        """Undo every patch and module-class swap; re-point copies back at the originals."""
        by_replacement = {id(p.replacement): p for p in self.patches}
        for patch in reversed(self.patches):
            current = (
                patch.owner.__dict__.get(patch.name)
                if isinstance(patch.owner, type)
                else getattr(patch.owner, patch.name, None)
            )
            if current is not patch.replacement:
                logger.warning(
                    "%s.%s was re-patched by someone else; restoring the original anyway", patch.owner, patch.name
                )
            setattr(patch.owner, patch.name, patch.original)
        self._rebind(by_replacement, lambda p: p.replacement, lambda p: p.original)
        for module, cls in reversed(self.module_classes):
            module.__class__ = cls
        self.patches.clear()
        self.module_classes.clear()
        self.done.clear()

    def _rebind(self, table: dict[int, Patch], old: Callable[[Patch], Any], new: Callable[[Patch], Any]) -> int:
        count = 0
        for mod_name, module in list(sys.modules.items()):
            if module is None or not mod_name.startswith(self.packages):
                continue
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for attr, value in list(namespace.items()):
                patch = table.get(id(value))
                if patch is not None and old(patch) is value:
                    namespace[attr] = new(patch)
                    count += 1
        return count


Applier = Callable[[types.ModuleType], None]


class ImportRoutes:
    """Appliers keyed by module name, each run once per ``patches``: at once for modules already
    imported, else right after their import (wrapt post-import hooks, registered once), and only
    while ``is_active()``."""

    def __init__(
        self,
        patches: PatchSet,
        appliers: list[tuple[str, Applier]],
        lock: Any,
        is_active: Callable[[], bool],
        on_error: Optional[Callable[[types.ModuleType, BaseException], None]] = None,
    ) -> None:
        self._patches = patches
        self._appliers = appliers
        self._lock = lock
        self._is_active = is_active
        self.on_error = on_error  # a failure inside a later import (raising there would break the import)
        self._registered = False
        self._activating = False

    def activate(self) -> None:
        """Apply every applier whose module is imported, and arrange for the others (call when active)."""
        import wrapt

        if not self._registered:
            self._registered = True
            self._activating = True  # failures of hooks firing at once are raised to the caller
            failure: Optional[BaseException] = None
            try:
                for module_name, applier in self._appliers:
                    # fires at once for modules already imported, else right after their import; every
                    # hook is registered even after a failure (the caller undoes what was applied)
                    try:
                        wrapt.register_post_import_hook(self._hook(applier), module_name)
                    except Exception as err:
                        failure = failure or err
            finally:
                self._activating = False
            if failure is not None:
                raise failure
            return
        for module_name, applier in self._appliers:
            if module_name in sys.modules:
                self.apply(applier, sys.modules[module_name])

    def apply(self, applier: Applier, module: types.ModuleType) -> None:
        key = f"{applier.__name__}:{module.__name__}"
        if key in self._patches.done:
            return
        self._patches.done.add(key)
        applier(module)

    def _hook(self, applier: Applier) -> Applier:
        def on_import(module: types.ModuleType) -> None:
            with self._lock:
                if not self._is_active():
                    return
                try:
                    self.apply(applier, module)
                except Exception as err:
                    if self._activating or self.on_error is None:
                        raise
                    self.on_error(module, err)

        return on_import
