"""A hand-written Megatron-style mpu class over a pipeline grid: ``class MPU`` whose ``__init__``
only stores a grid (``self.grid = grid``) and whose getters return that grid's answers
(``return self.grid.get_slice_parallel_group()``).

Shared by the grid-user codemod (the grid reads inside the class become ``mesh_of(self.grid)``
queries, exact for a legacy grid and for a mesh alike), the topology codemod (a grid handed to
such a class may still become a mesh) and the initialize codemod (``mpu=<instance>`` becomes
``mesh=<the mesh>`` where each of the class's getters answers as the mesh does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from .._engine.base import find_all
from . import _grid_api as grid_api

# getter stem -> the mesh dims DeepSpeed reads through it (Megatron's "model parallel" is the tensor
# dim, DeepSpeed's bwc reads get_model_parallel_* as the tensor dim too)
_STEM_DIMS = {
    "data_parallel": '"dp"',
    "tensor_model_parallel": '"tp"',
    "model_parallel": '"tp"',
    "slice_parallel": '"tp"',
    "pipeline_model_parallel": '"pp"',
    "pipe_parallel": '"pp"',
    "sequence_parallel": '"sp"',
}
_QUERIES = {"group": "get_group", "world_size": "size", "rank": "get_local_rank"}
# mpu getter -> (query, dims) as the getter's name says
GETTER_QUERIES: dict[str, tuple[str, str]] = {
    f"get_{stem}_{what}": (query, dims) for stem, dims in _STEM_DIMS.items() for what, query in _QUERIES.items()
}


@dataclass
class GridWrapper:
    """What the codemods know of one such class."""

    name: str
    node: cst.ClassDef
    params: dict[str, int] = field(default_factory=dict)  # grid attribute -> its __init__ parameter (0: after self)
    keywords: dict[str, str] = field(default_factory=dict)  # grid attribute -> that parameter's name
    # method -> (grid attribute, the mesh query its grid call is, ``{m}`` the mesh)
    getters: dict[str, tuple[str, str]] = field(default_factory=dict)

    def mesh_form(self, method: str) -> Optional[str]:
        """The mesh expression (``{m}``: the mesh) the grid call of ``method`` answers, or None."""
        held = self.getters.get(method)
        return held[1] if held is not None else None


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _self_attr(node: cst.BaseExpression, self_name: str) -> Optional[str]:
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == self_name:
        return node.attr.value
    return None


def _body(function: cst.FunctionDef) -> list[cst.BaseStatement]:
    """The statements of ``function`` without its docstring."""
    body = list(function.body.body) if isinstance(function.body, cst.IndentedBlock) else []
    if (
        body
        and isinstance(body[0], cst.SimpleStatementLine)
        and len(body[0].body) == 1
        and isinstance(body[0].body[0], cst.Expr)
        and isinstance(body[0].body[0].value, cst.SimpleString)
    ):
        body = body[1:]
    return body


def _plain_params(function: cst.FunctionDef) -> Optional[list[str]]:
    params = function.params
    if (
        params.star_kwarg is not None
        or isinstance(params.star_arg, cst.Param)
        or params.kwonly_params
        or params.posonly_params
        or not params.params
    ):
        return None
    if any(p.default is not None for p in params.params):
        return None
    return [p.name.value for p in params.params]


def _grid_query(value: cst.BaseExpression, me: str, grid_methods: frozenset) -> Optional[tuple[str, str]]:
    """(attribute, mesh query template) of ``self.<attr>.<grid method>()`` or of the
    ``mesh_of(self.<attr>).<query>(<dims>)`` the grid-user codemod made of it."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
        return None
    func = value.func
    attr = _self_attr(func.value, me)
    if attr is not None:
        if value.args or func.attr.value not in grid_methods or func.attr.value not in grid_api.METHODS:
            return None
        return attr, grid_api.METHODS[func.attr.value]
    inner = func.value
    if not (
        isinstance(inner, cst.Call) and len(inner.args) == 1 and not inner.args[0].keyword and not inner.args[0].star
    ):
        return None
    name = code(inner.func)
    attr = _self_attr(inner.args[0].value, me)
    if name not in ("mesh_of", "mesh_core.mesh_of") or attr is None:
        return None
    template = "{m}." + func.attr.value + "(" + ", ".join(code(a.value) for a in value.args) + ")"
    if template not in grid_api.METHODS.values() or any(a.keyword or a.star for a in value.args):
        return None
    return attr, template


def grid_wrapper(cls: cst.ClassDef, grid_methods: frozenset = frozenset(grid_api.METHODS)) -> Optional[GridWrapper]:
    """``cls`` as a :class:`GridWrapper` (its getters calling only ``grid_methods`` on the stored
    grid), or None when it is not one."""
    if cls.decorators or any(
        not (isinstance(b.value, cst.Name) and b.value.value == "object") or b.keyword for b in cls.bases
    ):
        return None
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    wrapper = GridWrapper(cls.name.value, cls)
    functions: list[cst.FunctionDef] = []
    for statement in _body_of_class(cls):
        if not isinstance(statement, cst.FunctionDef) or statement.decorators or statement.asynchronous:
            return None
        functions.append(statement)
    init = [f for f in functions if f.name.value == "__init__"]
    if len(init) != 1:
        return None
    params = _plain_params(init[0])
    if params is None or len(params) < 2:
        return None
    self_name = params[0]
    for statement in _body(init[0]):
        # only self.<attr> = <parameter>: the constructor has no other effect
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return None
        assign = statement.body[0]
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Name)):
            return None
        attr = _self_attr(assign.targets[0].target, self_name)
        if attr is None or assign.value.value not in params[1:] or attr in wrapper.params:
            return None
        wrapper.params[attr] = params.index(assign.value.value) - 1
        wrapper.keywords[attr] = assign.value.value
    if not wrapper.params:
        return None
    for function in functions:
        if function.name.value == "__init__":
            continue
        method = function.name.value
        if method not in GETTER_QUERIES or _plain_params(function) is None or len(function.params.params) != 1:
            return None
        me = function.params.params[0].name.value
        body = _body(function)
        if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
            return None
        ret = body[0].body[0]
        if not isinstance(ret, cst.Return) or ret.value is None:
            return None
        held = _grid_query(ret.value, me, grid_methods)
        if held is None or held[0] not in wrapper.params:
            return None
        wrapper.getters[method] = held
    if not wrapper.getters:
        return None
    # the grid attributes are read nowhere else (nor rebound)
    reads = sum(1 for node in find_all(cls, cst.Attribute) if node.attr.value in wrapper.params)
    if reads != len(wrapper.params) + len(wrapper.getters):
        return None
    return wrapper


def _body_of_class(cls: cst.ClassDef) -> list[cst.BaseStatement]:
    body = list(cls.body.body)  # type: ignore[union-attr]
    if (
        body
        and isinstance(body[0], cst.SimpleStatementLine)
        and len(body[0].body) == 1
        and isinstance(body[0].body[0], cst.Expr)
        and isinstance(body[0].body[0].value, cst.SimpleString)
    ):
        body = body[1:]
    return body


def module_wrappers(
    module: cst.Module, grid_methods: frozenset = frozenset(grid_api.METHODS)
) -> dict[str, GridWrapper]:
    """The grid-wrapping mpu classes defined at the top level of ``module``, by name (a name
    defined once)."""
    found: dict[str, GridWrapper] = {}
    names = [s.name.value for s in module.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))]
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and names.count(statement.name.value) == 1:
            wrapper = grid_wrapper(statement, grid_methods)
            if wrapper is not None:
                found[wrapper.name] = wrapper
    return found


def grid_argument(wrapper: GridWrapper, call: cst.Call, attr: str) -> Optional[cst.BaseExpression]:
    """The argument ``call`` (a call of the class) passes for the grid stored as ``attr``."""
    if any(a.star for a in call.args) or len(call.args) != len(wrapper.params):
        return None
    for index, arg in enumerate(call.args):
        if arg.keyword is None and index == wrapper.params[attr]:
            return arg.value
        if arg.keyword is not None and arg.keyword.value == wrapper.keywords[attr]:
            return arg.value
    return None


def instances_get_grids(command, wrapper: GridWrapper, is_grid) -> bool:
    """Every use of the class's name in its module is a call ``C(...)`` whose grid arguments are
    names ``is_grid`` accepts (a local ``PipelineParallelGrid``, or the mesh it became)."""
    scope = command.scope_of(wrapper.node)
    if scope is None:
        return False
    bindings = scope.assignments[wrapper.name]
    if len(bindings) != 1:
        return False
    references = list(next(iter(bindings)).references)
    if not references:
        return False
    for access in references:
        call = command.parent(access.node)
        if not (isinstance(call, cst.Call) and call.func is access.node):
            return False
        for attr in wrapper.params:
            grid = grid_argument(wrapper, call, attr)
            if not isinstance(grid, cst.Name) or not is_grid(grid):
                return False
    return True


def getter_advice(wrapper: GridWrapper, method: str, receiver: str) -> Optional[str]:
    """The TODOV1 advice for ``method`` of the class where its grid is not proven: its own mesh query."""
    form = wrapper.mesh_form(method)
    if form is None:
        return None
    replacement = form.format(m=f"mesh_of({receiver})")
    return (
        f"{wrapper.name}.{method}: not every {wrapper.name}(...) is proven to get a PipelineParallelGrid or "
        f"a mesh; write return {replacement}; exact for either (mesh_of answers with the grid's own getter, "
        "with or without compat.install())"
    )


def answers_as_mesh(wrapper: GridWrapper, pp_is_one: bool) -> bool:
    """Each getter of the class answers what the mesh's own getter of that name does, so the mesh
    can stand for the class as DeepSpeed's mpu (``pp_is_one``: the grid's pipeline size is 1, where
    the grid's pipe × tensor is the tensor dim)."""
    for method, (_, form) in wrapper.getters.items():
        query, dims = GETTER_QUERIES[method]
        wanted = {f"{{m}}.{query}({dims})"}
        if pp_is_one and dims == '"tp"':
            wanted.add(f"{{m}}.{query}({grid_api.PP_TP})")
        if form not in wanted:
            return False
    # the layout DeepSpeed reads: data and tensor groups; no pipeline getters only where pp is 1
    has = {GETTER_QUERIES[m][1] for m in wrapper.getters}
    return '"dp"' in has and '"tp"' in has and ('"pp"' in has or pp_is_one) and '"sp"' not in has
