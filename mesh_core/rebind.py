"""Put new objects where old ones are held: a bounded walk over an object graph, by identity.

Used to rebind process groups (:mod:`mesh_core.step_aside`): a released group's holders (a mesh, a
DeepSpeed engine, its optimizer, ZeRO-3 parameters) get a stand-in, then the resumed group.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Iterable, Mapping

import torch

DESCEND_MODULES = ("deepspeed", "compat", "mesh_core")


def default_descend(obj: Any) -> bool:
    """Objects whose attributes the walk visits: ds-mesh's and DeepSpeed's own objects, torch modules,
    optimizers and tensors (ZeRO-3 parameters carry their group as an attribute)."""
    if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)):
        return True
    if getattr(type(obj), "_not_a_holder", False):  # bookkeeping (a registry, a release record)
        return False
    module = getattr(type(obj), "__module__", "") or ""
    return module.split(".", 1)[0] in DESCEND_MODULES


class _Walk:
    """One bounded walk over attributes (``vars``), lists, tuples, dicts and sets of the roots:
    every object is visited once, objects ``descend`` refuses (and classes, functions, modules
    other than the roots) are not entered."""

    def __init__(self, targets: Mapping[int, tuple[Any, Any]], descend: Callable[[Any], bool], replace: bool):
        self.targets, self.descend, self.replace = targets, descend, replace
        self.seen: set[int] = set()
        self.found: list[str] = []
        self.held: set[int] = set()  # ids of the targets met

    def hit(self, value: Any) -> bool:
        entry = self.targets.get(id(value))
        if entry is not None and entry[0] is value:
            self.held.add(id(value))
            return True
        return False

    def slot(self, value: Any, path: str) -> Any:
        """The value to store in place of ``value`` (itself when nothing changes)."""
        if self.hit(value):
            self.found.append(path)
            return self.targets[id(value)][1] if self.replace else value
        if isinstance(value, tuple):
            items = [self.slot(v, f"{path}[{i}]") for i, v in enumerate(value)]
            if any(a is not b for a, b in zip(items, value)):
                return type(value)._make(items) if hasattr(value, "_fields") else type(value)(items)
            return value
        if isinstance(value, (list, dict, set)) or self.descend(value):
            self.visit(value, path)
        return value

    def visit(self, obj: Any, path: str) -> None:
        if id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                new = self.slot(v, f"{path}[{i}]")
                if new is not v:
                    obj[i] = new
        elif isinstance(obj, dict):
            self._visit_dict(obj, path)
        elif isinstance(obj, set):
            hits = [v for v in obj if self.hit(v)]
            for v in hits:
                self.found.append(f"{path}{{group}}")
                if self.replace:
                    obj.discard(v)
                    obj.add(self.targets[id(v)][1])
        else:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                self._visit_dict(attrs, path, attribute=True)

    def _visit_dict(self, d: dict, path: str, attribute: bool = False) -> None:
        rekey = False
        for k, v in list(d.items()):
            where = f"{path}.{k}" if attribute else f"{path}[{k!r}]"
            new = self.slot(v, where)
            if new is not v:
                d[k] = new
            rekey = rekey or self.hit(k)
        if rekey:
            items = list(d.items())
            for k, _ in items:
                if self.hit(k):
                    self.found.append(f"{path}[key]")
            if self.replace:
                d.clear()
                d.update((self.targets[id(k)][1] if self.hit(k) else k, v) for k, v in items)

    def run(self, roots: Iterable[Any]) -> list[str]:
        for root in roots:
            name = getattr(root, "__name__", None) if isinstance(root, types.ModuleType) else None
            self.visit(root, name or type(root).__name__)
        return self.found


def rebind_references(
    roots: Iterable[Any],
    replacements: Mapping[int, tuple[Any, Any]],
    *,
    descend: Callable[[Any], bool] = default_descend,
) -> list[str]:
    """Put each new group wherever its old one is held under ``roots`` (see :class:`_Walk`);
    returns the paths rebound (e.g. ``DeepSpeedEngine.optimizer.dp_process_group``)."""
    if not replacements:
        return []
    return _Walk(replacements, descend, replace=True).run(roots)


def find_references(
    roots: Iterable[Any], groups: Iterable[Any], *, descend: Callable[[Any], bool] = default_descend
) -> list[str]:
    """Paths under ``roots`` that still hold one of ``groups``."""
    targets = {id(g): (g, g) for g in groups}
    return _Walk(targets, descend, replace=False).run(roots) if targets else []


def held_under(
    roots: Iterable[Any], candidates: Iterable[Any], *, descend: Callable[[Any], bool] = default_descend
) -> list[Any]:
    """The ``candidates`` that something under ``roots`` holds, in the candidates' order."""
    candidates = list(candidates)
    walk = _Walk({id(c): (c, c) for c in candidates}, descend, replace=False)
    walk.run(roots)
    return [c for c in candidates if id(c) in walk.held]


__all__ = ["DESCEND_MODULES", "default_descend", "find_references", "held_under", "rebind_references"]
