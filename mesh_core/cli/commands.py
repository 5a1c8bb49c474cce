"""``mesh show``: a layout's groups, rank coordinates and communicator counts, as text or JSON.

Everything here is layout math (:class:`MeshLayout`): no process group is created, so any world
size can be shown on a laptop. The communicator counts put what :class:`DeepSpeedDeviceMesh` would
create beside what DeepSpeed 0.19.8's own builders create for the same layout
(:mod:`mesh_core.cli.legacy_counts`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from typing import Any, Optional, Sequence

import numpy as np

from ..config import spec_from_config
from ..layout import MeshLayout
from ..plan import creation_plan, format_plan
from ..spec import MESH_DIMS, MeshSpec, MeshSpecError
from .legacy_counts import legacy_counts, mesh_count

# The built-in example shown by a bare ``mesh show``.
EXAMPLE = {"world_size": 16, "pp": 2, "tp": 2, "ep": 2, "dp": "auto", "gpus_per_node": 8}
GROUP_LIST_LIMIT = 32  # groups per dim printed in full; more are summarised unless --all
RANK_TABLE_LIMIT = 64  # rank rows printed in full
JSON_FULL_LIMIT = 4096  # ranks up to which --json lists every group and coordinate
ALL_LIMIT = 65536  # ranks up to which --all may list everything
MAX_WORLD = 1 << 20  # mesh show's hard limit (time and memory grow with the world size)
WIDTH = 100


class UsageError(Exception):
    """A command line that cannot be shown; the message says what to change."""


# --- what the mesh looks like -------------------------------------------------------------------
def shown_dims(spec: MeshSpec) -> list[tuple[str, ...]]:
    """The dim sets worth listing: every declared dim of size > 1, HSDP's dp, ZeRO's dp x sp, ep/edp."""
    dims: list[tuple[str, ...]] = [(n,) for n, s in zip(spec.names, spec.sizes) if s > 1]
    if (
        "dp" not in spec.names
        and spec.dim_size("dp") > 1
        and all(spec.dim_size(d) > 1 for d in ("dp_replicate", "dp_shard"))
    ):
        dims.append(("dp",))
    if spec.dim_size("sp") > 1 and spec.dim_size("dp") > 1:
        dims.append(("dp", "sp"))
    if spec.ep > 1:
        dims += [("ep",), ("edp",)]
    return dims or [("dp",)]


def mesh_flatten(spec: MeshSpec) -> list[tuple[str, ...]]:
    """The flattened groups the counts assume the mesh builds (ZeRO's dp x sp when sp > 1)."""
    return [("dp", "sp")] if spec.dim_size("sp") > 1 else []


def dims_label(dims: Sequence[str]) -> str:
    return ",".join(dims)


def build_report(
    spec: MeshSpec, *, gpus_per_node: Optional[int] = None, rank: Optional[int] = None, full: bool = False
) -> dict[str, Any]:
    """Everything ``mesh show`` prints, as plain data (the ``--json`` output)."""
    layout = MeshLayout(spec)
    if rank is not None and not layout.contains(rank):
        raise MeshSpecError(f"--rank {rank} is not part of {spec.describe()}; valid ranks are {_span(spec.ranks)}")
    full = full or spec.size <= JSON_FULL_LIMIT
    report: dict[str, Any] = {
        "mesh": spec.describe(),
        "world_size": spec.world_size,
        "ranks": _span(spec.ranks),
        "order": list(spec.names),
        "shape": spec.shape,
        "ep": spec.ep,
        "data_before_expert": spec.data_before_expert,
        "gpus_per_node": gpus_per_node,
        "nodes": math.ceil(spec.world_size / gpus_per_node) if gpus_per_node else None,
        "dims": [],
        "warnings": [],
    }
    if gpus_per_node and spec.world_size % gpus_per_node:
        report["warnings"].append(_partial_node_warning(spec.world_size, gpus_per_node))
    for dims in shown_dims(spec):
        groups = layout.groups_array(dims)
        entry: dict[str, Any] = {
            "dims": dims_label(dims),
            "size": int(groups.shape[1]),
            "num_groups": int(groups.shape[0]),
        }
        if full:
            entry["groups"] = groups.tolist()
        else:
            entry["first_groups"], entry["last_group"] = groups[:3].tolist(), groups[-1].tolist()
        if gpus_per_node:
            crossing = _crossing_rows(groups, gpus_per_node)
            entry["cross_node_groups"] = int(crossing.sum())
            if dims == ("tp",) and crossing.any():
                example = groups[crossing][0].tolist()
                report["warnings"].append(
                    f"{int(crossing.sum())} of {groups.shape[0]} tp groups cross a node boundary "
                    f"(e.g. {_short(example)} spans nodes {_nodes_text(example, gpus_per_node)}); tp traffic "
                    f"leaves the node: choose tp dividing --gpus-per-node {gpus_per_node} and aligned to it"
                )
        report["dims"].append(entry)
    coordinate_ranks = list(spec.ranks) if full else list(spec.ranks[:8]) + list(spec.ranks[-8:])
    report["coordinates"] = [_coordinate_row(layout, r, gpus_per_node) for r in coordinate_ranks]
    report["coordinates_complete"] = full
    report["communicators"] = _communicators(spec, spec.ranks[0] if rank is None else rank)
    # the member-only creation plan (calls per rank, eager vs lazy groups)
    report["plan"] = creation_plan(spec, flatten=mesh_flatten(spec), rank=rank).to_dict()
    if rank is not None:
        report["rank_view"] = rank_view(layout, rank, gpus_per_node)
    return report


def _partial_node_warning(world: int, gpus_per_node: int) -> str:
    if world < gpus_per_node:
        return f"--gpus-per-node {gpus_per_node} is more than the {world} ranks: the job fills part of one node"
    return (
        f"--gpus-per-node {gpus_per_node} does not divide the world of {world} ranks: "
        f"{world // gpus_per_node} full nodes and one with {world % gpus_per_node} ranks"
    )


def rank_view(layout: MeshLayout, rank: int, gpus_per_node: Optional[int] = None) -> dict[str, Any]:
    """One rank's coordinate, its group and index along every shown dim, and its pipeline peers."""
    spec = layout.spec
    view: dict[str, Any] = {"rank": rank, "coordinate": layout.coordinate(rank), "groups": {}}
    if gpus_per_node:
        view["node"] = rank // gpus_per_node
    for dims in shown_dims(spec):
        members = layout.group_ranks(dims, rank)
        item: dict[str, Any] = {"ranks": members, "index": layout.coordinate_of(rank, dims)}
        if gpus_per_node:
            item["crosses_nodes"] = len({r // gpus_per_node for r in members}) > 1
        view["groups"][dims_label(dims)] = item
    if spec.dim_size("pp") > 1:
        view["next_stage"] = layout.stage_peer(rank, +1)
        view["prev_stage"] = layout.stage_peer(rank, -1)
    return view


def _communicators(spec: MeshSpec, rank: int) -> dict[str, Any]:
    flatten = mesh_flatten(spec)
    ours = mesh_count(spec, flatten=flatten, rank=rank)
    legacy = legacy_counts(spec)
    legacy_world = sum(c.new_group_calls for c in legacy)
    legacy_rank = sum(c.per_rank for c in legacy)
    return {
        "rank": rank,
        "mesh": {
            "builder": f"DeepSpeedDeviceMesh(flatten={[list(f) for f in flatten]})",
            "world": ours.new_group_calls,
            "per_rank": ours.per_rank,
            "calls_on_rank": ours.per_rank,  # member-only creation: one call per own group
            "reused": ours.reused,
        },
        "legacy": {
            "version": "deepspeed 0.19.8",
            "world": legacy_world,
            "per_rank": legacy_rank,
            "calls_on_rank": legacy_world,  # collective new_group: every rank issues every call
            "builders": [
                {"builder": c.builder, "world": c.new_group_calls, "per_rank": c.per_rank, "formula": c.formula}
                for c in legacy
            ],
        },
        "ratio_world": _ratio(ours.new_group_calls, legacy_world),
        "ratio_per_rank": _ratio(ours.per_rank, legacy_rank),
    }


def _coordinate_row(layout: MeshLayout, rank: int, gpus_per_node: Optional[int]) -> dict[str, int]:
    row = {"rank": rank}
    if gpus_per_node:
        row["node"] = rank // gpus_per_node
    row.update(layout.coordinate(rank))
    if layout.spec.ep > 1:
        row["ep"] = layout.coordinate_of(rank, "ep")
        row["edp"] = layout.coordinate_of(rank, "edp")
    return row


def _crossing_rows(groups: np.ndarray, gpus_per_node: int) -> np.ndarray:
    nodes = groups // gpus_per_node
    return nodes.min(axis=1) != nodes.max(axis=1)


# --- text ---------------------------------------------------------------------------------------
def format_report(report: dict[str, Any], *, show_all: bool = False) -> str:
    """The human-readable table ``mesh show`` prints."""
    lines = [f"mesh: {report['mesh']}"]
    dims = " x ".join(f"{n}={s}" for n, s in report["shape"].items())
    expert = (
        f", ep={report['ep']}" + (" (data before expert)" if report["data_before_expert"] else "")
        if report["ep"] > 1
        else ""
    )
    lines.append(f"  order (outer -> inner): {', '.join(report['order'])}; {dims}{expert}")
    if report["gpus_per_node"]:
        per_node, full = report["gpus_per_node"], report["world_size"] // report["gpus_per_node"]
        rest = report["world_size"] % per_node
        nodes = f"{full} x {per_node} GPUs" if full else ""
        if rest:
            nodes += (" + " if full else "") + f"1 node with {rest} of {per_node} GPUs used"
        lines.append(f"  nodes: {nodes} (ranks numbered node by node)")
    lines += [f"warning: {w}" for w in report["warnings"]]
    view = report.get("rank_view")
    if view is not None:
        lines += ["", *_format_rank_view(view)]
    else:
        lines += ["", *_format_groups(report, show_all), "", *_format_coordinates(report, show_all)]
    lines += ["", *_format_communicators(report["communicators"])]
    if "plan" in report:
        lines += ["", *format_plan(report["plan"])]
    return "\n".join(lines)


def _format_groups(report: dict[str, Any], show_all: bool) -> list[str]:
    lines = ["groups per dim"]
    columns = [("dims", "dims", "<"), ("size", "size", ">"), ("groups", "num_groups", ">")]
    if report["gpus_per_node"]:
        columns.append(("cross-node", "cross_node_groups", ">"))
    widths = [max([len(title)] + [len(str(e[key])) for e in report["dims"]]) for title, key, _ in columns]
    lines.append("  " + "  ".join(f"{title:{align}{w}}" for (title, _, align), w in zip(columns, widths)))
    indent = " " * 4
    for entry in report["dims"]:
        lines.append("  " + "  ".join(f"{entry[key]:{align}{w}}" for (_, key, align), w in zip(columns, widths)))
        groups = entry.get("groups")
        if groups is not None and (show_all or len(groups) <= GROUP_LIST_LIMIT):
            text = " ".join(_short(g, show_all) for g in groups)
        else:
            first = entry.get("first_groups") or groups[:3]
            last = entry.get("last_group") or groups[-1]
            text = " ".join(_short(g) for g in first) + f" ... {_short(last)}  ({entry['num_groups']} groups)"
        lines += textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)
    return lines


def _format_coordinates(report: dict[str, Any], show_all: bool) -> list[str]:
    rows = report["coordinates"]
    if not rows:
        return []
    columns = list(rows[0])
    complete = report["coordinates_complete"] and (show_all or len(rows) <= RANK_TABLE_LIMIT)
    shown = rows if complete else rows[:8] + [None] + rows[-8:]
    widths = {c: max([len(c), 3] + [len(str(row[c])) for row in shown if row]) for c in columns}
    lines = ["rank -> coordinate", "  " + " ".join(f"{c:>{widths[c]}}" for c in columns)]
    for row in shown:
        lines.append(
            "  " + (" ".join(f"{row[c]:>{widths[c]}}" for c in columns) if row else f"{'...':>{widths['rank']}}")
        )
    return lines


def _format_rank_view(view: dict[str, Any]) -> list[str]:
    coord = ", ".join(f"{k}={v}" for k, v in view["coordinate"].items())
    node = f", node {view['node']}" if "node" in view else ""
    lines = [f"rank {view['rank']}{node}: {coord}"]
    name_w = max([4] + [len(d) for d in view["groups"]])
    index_w = max([1] + [len(str(item["index"])) for item in view["groups"].values()])
    for dims, item in view["groups"].items():
        cross = " (crosses nodes)" if item.get("crosses_nodes") else ""
        lines.append(f"  {dims:<{name_w}}  index {item['index']:>{index_w}} in {_short(item['ranks'])}{cross}")
    if "next_stage" in view:
        lines.append(f"  pipeline: next stage rank {view['next_stage']}, previous stage rank {view['prev_stage']}")
    return lines


def _format_communicators(comm: dict[str, Any]) -> list[str]:
    mesh, legacy = comm["mesh"], comm["legacy"]
    rows = [
        ("communicators (new_group calls)", "this mesh", legacy["version"], "new/legacy"),
        ("  created in the world", mesh["world"], legacy["world"], _ratio_text(comm["ratio_world"])),
        (
            f"  calls issued by rank {comm['rank']}",
            mesh["calls_on_rank"],
            legacy["calls_on_rank"],
            _ratio_text(_ratio(mesh["calls_on_rank"], legacy["calls_on_rank"])),
        ),
        (
            f"  communicators rank {comm['rank']} is in",
            mesh["per_rank"],
            legacy["per_rank"],
            _ratio_text(comm["ratio_per_rank"]),
        ),
    ]
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    lines = [f"{a:<{widths[0]}}  {b!s:>{widths[1]}}  {c!s:>{widths[2]}}  {d!s:>{widths[3]}}" for a, b, c, d in rows]
    lines += [
        f"  this mesh: {mesh['builder']}; {mesh['reused']} requested rank sets reuse an existing group or WORLD",
        "  legacy:",
    ]
    lines += [
        f"    {b['builder']}: {b['world']} ({b['formula']}), {b['per_rank']} per rank" for b in legacy["builders"]
    ]
    return lines


def _short(ranks: Sequence[int], show_all: bool = False) -> str:
    ranks = list(ranks)
    if show_all or len(ranks) <= 8:
        return "[" + ",".join(map(str, ranks)) + "]"
    step = ranks[1] - ranks[0]
    if all(b - a == step for a, b in zip(ranks, ranks[1:])):
        return f"[{ranks[0]},{ranks[1]}..{ranks[-1]}]"
    return "[" + ",".join(map(str, ranks[:4])) + ",..," + str(ranks[-1]) + "]"


def _nodes_text(ranks: Sequence[int], gpus_per_node: int) -> str:
    nodes = sorted({r // gpus_per_node for r in ranks})
    return f"{nodes[0]}-{nodes[-1]}" if len(nodes) > 1 else str(nodes[0])


def _span(ranks: Sequence[int]) -> str:
    if isinstance(ranks, range):
        return f"{ranks.start}..{ranks.stop - 1}"
    return _short(ranks)


def _ratio(new: int, legacy: int) -> Optional[float]:
    return round(new / legacy, 4) if legacy else None


def _ratio_text(ratio: Optional[float]) -> str:
    return "-" if ratio is None else f"{ratio:.3f}"


# --- command line -------------------------------------------------------------------------------
def _size(text: str) -> Any:
    if text.lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; give a positive integer or 'auto'") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line (no usage dump) and exit code 2, like every bad input
        raise UsageError(f"{message} (see {self.prog} --help)")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="mesh", description="See a parallel layout before you run it.")
    commands = top.add_subparsers(dest="command")
    show = commands.add_parser(
        "show",
        help="groups, rank coordinates and communicator counts of a layout",
        description="Print every group per dim, the rank -> coordinate map and the communicator counts "
        "(beside DeepSpeed 0.19.8's) of a layout. With no layout arguments, shows a built-in example "
        f"(world {EXAMPLE['world_size']}, pp={EXAMPLE['pp']}, tp={EXAMPLE['tp']}, ep={EXAMPLE['ep']}, dp auto, "
        f"{EXAMPLE['gpus_per_node']} GPUs per node).",
    )
    commands.add_parser(
        "doctor",
        add_help=False,  # dispatched by main() before parsing (run_doctor)
        help="is this environment ready? torch / deepspeed / libcst ranges, the DS_MESH hook, "
        "accelerator, the shm op; --json",
    )
    show.add_argument("--world-size", "-w", type=int, help="number of ranks (GPUs) in the job")
    for dim in MESH_DIMS:
        show.add_argument(f"--{dim.replace('_', '-')}", dest=dim, type=_size, metavar="N|auto", help=f"size of {dim}")
    show.add_argument("--ep", type=int, help="expert-parallel size (splits the data-parallel ranks)")
    show.add_argument("--data-before-expert", action="store_true", help="DeepSpeed's D+E expert layout")
    show.add_argument("--order", help="dims outermost first, comma separated (default pp,dp,sp,tp)")
    show.add_argument(
        "--config",
        help="a DeepSpeed config JSON ('mesh' section or legacy keys); --pp/--ep act as the model's num_stages/ep_size",
    )
    show.add_argument("--rank", "-r", type=int, help="show one rank's view")
    show.add_argument("--gpus-per-node", "-g", type=int, help="node size: shows groups that cross nodes")
    show.add_argument("--all", action="store_true", help="list every group and rank, however large the world")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--svg", metavar="FILE", help="draw the rank grid to an SVG file (needs matplotlib)")
    show.add_argument("--png", metavar="FILE", help="draw the rank grid to a PNG file (needs matplotlib)")
    show.add_argument("--color-by", metavar="DIMS", help="dims whose groups colour the picture (default tp, else dp)")
    return top


def spec_from_args(args: argparse.Namespace) -> tuple[MeshSpec, Optional[int]]:
    """The spec and node size the arguments describe (the built-in example when none are given)."""
    sizes = {d: getattr(args, d) for d in MESH_DIMS if getattr(args, d) is not None}
    gpus_per_node = args.gpus_per_node
    if gpus_per_node is not None and gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node {gpus_per_node} is not valid; it must be a positive integer")
    order = [d.strip() for d in args.order.split(",") if d.strip()] if args.order is not None else None
    if order == []:
        raise UsageError(f"--order {args.order!r} names no dim; give dims outer to inner, e.g. --order pp,dp,sp,tp")
    if args.config:
        if sizes.keys() - {"pp"} or order:
            bad = sorted(sizes.keys() - {"pp"}) + (["order"] if order else [])
            raise UsageError(
                f"--config cannot be combined with {['--' + b.replace('_', '-') for b in bad]}; "
                "put them in the config's 'mesh' section (only --pp/--ep may add the model's sizes)"
            )
        if args.world_size is None:
            raise UsageError("--config needs --world-size: a DeepSpeed config does not say how many ranks run it")
        _check_world(args)
        try:
            with open(args.config, encoding="utf-8") as fh:
                config = json.load(fh)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UsageError(f"cannot read --config {args.config!r}: {err}") from None
        if not isinstance(config, dict):
            raise UsageError(f"--config {args.config!r} must be a JSON object, got {type(config).__name__}")
        try:
            spec = spec_from_config(config, args.world_size, num_stages=sizes.get("pp"), ep_size=args.ep)
        except MeshSpecError:
            raise
        except (TypeError, ValueError, AttributeError) as err:  # a wrongly typed value in the file
            raise UsageError(
                f"--config {args.config!r} has an invalid value ({err}); 'mesh' must be an object of positive "
                "integers or 'auto', as must 'sequence_parallel_size', 'data_parallel_size' and "
                "'tensor_parallel': {'autotp_size': N}"
            ) from None
        return spec, gpus_per_node
    if args.world_size is None and not sizes and args.ep is None and order is None:
        example = dict(EXAMPLE)
        world = example.pop("world_size")
        gpus_per_node = example.pop("gpus_per_node") if gpus_per_node is None else gpus_per_node
        return MeshSpec.build(world, **example), gpus_per_node
    if args.world_size is None:
        raise UsageError("--world-size is required when dims are given (e.g. --world-size 1024 --tp 8 --pp 4)")
    _check_world(args)
    spec = MeshSpec.build(
        args.world_size,
        order=order,
        ep=1 if args.ep is None else args.ep,
        data_before_expert=args.data_before_expert,
        **sizes,
    )
    return spec, gpus_per_node


def _check_world(args: argparse.Namespace) -> None:
    """Bounded time and memory: refuse worlds above :data:`MAX_WORLD` (and ``--all`` above :data:`ALL_LIMIT`)."""
    world = args.world_size
    if world > MAX_WORLD:
        raise UsageError(
            f"--world-size {world} is above mesh show's limit of {MAX_WORLD} ranks (its tables and counts grow "
            f"with the world); the layout math itself has no limit: mesh_core.MeshLayout(MeshSpec.build({world}, ...)) "
            "answers per-rank queries (coordinate, group_ranks) for any size"
        )
    if args.all and world > ALL_LIMIT:
        raise UsageError(
            f"--all lists every group and rank up to {ALL_LIMIT} ranks; --world-size {world} is "
            "larger: leave out --all for a summary, or use --rank R for one rank's groups"
        )


PICTURE_SUFFIXES = {"svg": (".svg", ".svgz"), "png": (".png",)}


def _check_picture_path(path: str, fmt: str) -> None:
    suffix = os.path.splitext(path)[1].lower()
    if suffix and suffix not in PICTURE_SUFFIXES[fmt]:
        other = next((f for f, names in PICTURE_SUFFIXES.items() if suffix in names), None)
        hint = f", or use --{other} {path}" if other else ""
        raise UsageError(
            f"--{fmt} {path!r} ends in {suffix!r} but --{fmt} writes {fmt.upper()}; name the file "
            f"{os.path.splitext(path)[0]}.{fmt}{hint}"
        )


def run_show(args: argparse.Namespace, out=None) -> int:
    """Execute ``mesh show``; returns the exit code."""
    out = out or sys.stdout
    for path, fmt in ((args.svg, "svg"), (args.png, "png")):
        if path:
            _check_picture_path(path, fmt)
    spec, gpus_per_node = spec_from_args(args)
    report = build_report(spec, gpus_per_node=gpus_per_node, rank=args.rank, full=args.all)
    for path, fmt in ((args.svg, "svg"), (args.png, "png")):
        if path:
            from .render import draw_mesh

            color_by = tuple(args.color_by.split(",")) if args.color_by else None
            try:
                draw_mesh(spec, path, fmt=fmt, gpus_per_node=gpus_per_node, color_by=color_by, highlight_rank=args.rank)
            except OSError as err:
                raise UsageError(f"cannot write --{fmt} {path!r}: {err.strerror or err}") from None
            report.setdefault("pictures", []).append(path)
    if args.json:
        json.dump(report, out, indent=1)
        out.write("\n")
    else:
        out.write(format_report(report, show_all=args.all) + "\n")
        for path in report.get("pictures", []):
            out.write(f"picture: {path}\n")
    return 0


# ``mesh doctor`` checks the whole distribution's environment (torch, deepspeed, the DS_MESH hook, the
# shm op); it lives in the top-level ``_ds_mesh_doctor`` module, outside the layers, and is loaded by
# name so that mesh_core depends on nothing above it (docs/architecture.md)
DOCTOR_MODULE = "_ds_mesh_doctor"


def run_doctor(argv: Sequence[str]) -> int:
    """``mesh doctor``: see the ``_ds_mesh_doctor`` module."""
    import importlib

    try:
        doctor = importlib.import_module(DOCTOR_MODULE)
    except ImportError:
        print(
            f"mesh: error: mesh doctor needs the {DOCTOR_MODULE} module of the ds-mesh distribution, which is "
            "not importable here; reinstall ds-mesh (pip install -e .)",
            file=sys.stderr,
        )
        return 2
    return doctor.main(list(argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``mesh`` / ``python -m mesh_core`` entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        return run_doctor(argv[1:])
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["show", *argv]  # "show" is the one command; allow leaving it out
    try:
        return run_show(parser().parse_args(argv))
    except (MeshSpecError, UsageError) as err:
        print(f"mesh: error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"mesh: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader stopped early (``mesh show ... | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail
        return 1
