"""Draw a layout's rank grid (SVG or PNG) with matplotlib, the optional ``plot`` extra.

Small layouts (up to :data:`FULL_RANKS` ranks in at most :data:`FULL_ROWS` rows) are drawn rank by
rank: pipeline stages are columns of cells; inside a stage, each row holds one tp block (the tp
coordinate runs left to right) and rows run over the remaining dims (dp, sp). Cells are coloured
by their group along ``color_by``; thick black outlines enclose each node's ranks, red dashes
mark tp groups that cross a node, and ``e<i>`` labels name each rank's EP group.

Larger layouts (up to :data:`MAX_DRAWN_RANKS`) get two panels instead: on the left the first rows
of pipeline stage 0 (at most :data:`DETAIL_RANKS` ranks) drawn as above, on the right every node
(or block of 8 ranks without ``gpus_per_node``) as one square coloured by the pipeline stage it
serves, with red crosses on nodes that hold a tp group crossing nodes. The rest of the layout
repeats the detail's pattern, shifted by the ranks per row / per stage the title states.
"""

from __future__ import annotations

import logging
import math
import textwrap
from typing import Optional, Sequence

import numpy as np

from .. import row_major
from ..layout import MeshLayout
from ..spec import MeshSpec, MeshSpecError

logger = logging.getLogger(__name__)

MAX_DRAWN_RANKS = 65536
FULL_RANKS = 256  # drawn rank by rank up to this many ranks ...
FULL_ROWS = 32  # ... in at most this many rows per stage
DETAIL_RANKS = 64  # ranks drawn in detail in the aggregated picture
DEFAULT_BLOCK = 8  # ranks per overview square when no node size is given
LEGEND_W = 1.9  # inches kept right of the overview for its legend
CELL = 0.55  # inches per rank cell
STAGE_GAP = 0.6  # cells between pipeline stage columns
TITLE_PT = 9  # title font size (points)
PALETTE = "tab20"


def default_color_dims(spec: MeshSpec) -> tuple[str, ...]:
    """tp when the mesh has it (tp blocks stand out), else dp."""
    return ("tp",) if spec.dim_size("tp") > 1 else ("dp",)


def cell_arrays(layout: MeshLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stage, tp coordinate, row) of every rank's cell, in mesh order (vectorised)."""
    spec = layout.spec
    index = np.arange(spec.size, dtype=np.int64)
    steps = row_major.strides(spec.sizes)
    coords = {name: row_major.coord_along(index, step, size) for name, step, size in zip(spec.names, steps, spec.sizes)}
    zero = np.zeros(spec.size, dtype=np.int64)
    row = zero.copy()
    for name in spec.names:
        if name not in ("pp", "tp"):
            row = row * spec.shape[name] + coords[name]
    return coords.get("pp", zero), coords.get("tp", zero), row


def cell_positions(layout: MeshLayout) -> dict[int, tuple[int, int, int]]:
    """rank -> (stage, tp coordinate, row) of its cell; the row indexes the remaining dims."""
    stage, lane, row = cell_arrays(layout)
    ranks = np.asarray(layout.spec.ranks)
    return {int(r): (int(s), int(t), int(w)) for r, s, t, w in zip(ranks, stage, lane, row)}


def draw_mesh(
    spec: MeshSpec,
    path: str,
    *,
    fmt: Optional[str] = None,
    gpus_per_node: Optional[int] = None,
    color_by: Optional[Sequence[str]] = None,
    highlight_rank: Optional[int] = None,
) -> str:
    """Write the rank-grid picture of ``spec`` to ``path`` (format from ``fmt`` or the suffix).

    Returns ``"full"`` or ``"aggregated"`` (which kind of picture was drawn).
    """
    if spec.size > MAX_DRAWN_RANKS:
        raise MeshSpecError(
            f"the mesh has {spec.size} ranks; pictures are limited to {MAX_DRAWN_RANKS} ranks "
            "(use --json or the text output for larger worlds)"
        )
    try:
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise ImportError("drawing needs matplotlib: pip install 'ds-mesh[plot]' (or pip install matplotlib)") from None

    layout = MeshLayout(spec)
    color_dims = tuple(color_by) if color_by else default_color_dims(spec)
    layout.normalize(color_dims)  # validates the dim names
    tp, stages = spec.dim_size("tp"), spec.dim_size("pp")
    rows = spec.size // (tp * stages)
    if spec.size <= FULL_RANKS and rows <= FULL_ROWS:
        fig = _full_figure(layout, color_dims, gpus_per_node, highlight_rank)
        kind = "full"
    else:
        fig = _aggregated_figure(layout, color_dims, gpus_per_node, highlight_rank)
        kind = "aggregated"
    fig.savefig(path, format=fmt)
    logger.info("wrote %s (%s picture)", path, kind)
    return kind


# --- shared pieces ------------------------------------------------------------------------------
def _legend(
    spec: MeshSpec,
    color_dims: Sequence[str],
    gpus_per_node: Optional[int],
    crossing: bool,
    highlight_rank: Optional[int],
) -> list[str]:
    legend = [f"colour: {','.join(color_dims)} group"]
    if spec.ep > 1:
        legend.append("e<i>: EP group")
    if gpus_per_node:
        legend.append(f"black outline: node ({gpus_per_node} GPUs)")
        if crossing:
            legend.append("red dashes: tp group crossing nodes")
    if highlight_rank is not None:
        legend.append(f"gold: rank {highlight_rank}")
    return legend


def _title(fig_width: float, lines: Sequence[str]) -> tuple[str, float]:
    chars = int(fig_width * 72 / (TITLE_PT * 0.62))  # characters per line: about 0.6 em each
    title = "\n".join(textwrap.fill(line, chars) for line in lines)
    return title, (title.count("\n") + 1) * TITLE_PT * 1.4 / 72 + 0.2  # inches


def _groups_of(layout: MeshLayout, dims: Sequence[str], ranks: Sequence[int]) -> dict[int, int]:
    """rank -> a colour index, distinct for distinct groups among ``ranks`` (in order of appearance)."""
    first_member: dict[int, int] = {}
    out = {}
    for rank in ranks:
        key = layout.group_ranks(tuple(dims), rank)[0]
        out[rank] = first_member.setdefault(key, len(first_member))
    return out


def _ep_index(layout: MeshLayout, ranks: Sequence[int]) -> dict[int, int]:
    """rank -> index of its EP group, for ``ranks``."""
    if layout.spec.ep <= 1 or not ranks:
        return {}
    groups = layout.groups_array("ep")
    rows, cols = np.nonzero(np.isin(groups, np.asarray(list(ranks))))
    return {int(groups[i, j]): int(i) for i, j in zip(rows, cols)}


def _cross_node_tp_ranks(layout: MeshLayout, gpus_per_node: Optional[int]) -> set[int]:
    if not gpus_per_node or layout.spec.dim_size("tp") == 1:
        return set()
    groups = layout.groups_array("tp")
    nodes = groups // gpus_per_node
    return {int(r) for r in groups[nodes.min(axis=1) != nodes.max(axis=1)].ravel()}


def _draw_cells(
    ax,
    pos: dict[int, tuple[int, int, int]],
    colour_of: dict[int, int],
    ep_of: dict[int, int],
    stage_width: float,
    highlight_rank: Optional[int],
    font: float,
) -> None:
    import matplotlib
    from matplotlib.patches import Rectangle

    palette = matplotlib.colormaps[PALETTE]
    for rank, (stage, lane, row) in pos.items():
        x = stage * stage_width + lane
        face = palette(colour_of[rank] % palette.N)
        ax.add_patch(Rectangle((x, -row - 1), 1, 1, facecolor=face, edgecolor="white", linewidth=0.8))
        label = str(rank) + (f"\ne{ep_of[rank]}" if rank in ep_of else "")
        weight = "bold" if rank == highlight_rank else "normal"
        ax.text(x + 0.5, -row - 0.5, label, ha="center", va="center", fontsize=font, fontweight=weight)


def _mark_crossing(ax, pos, crossing: set[int], tp: int, stage_width: float) -> None:
    from matplotlib.patches import Rectangle

    for stage, row in sorted({(pos[r][0], pos[r][2]) for r in crossing if r in pos}):  # a tp group is a row
        x = stage * stage_width
        ax.add_patch(
            Rectangle(
                (x + 0.08, -row - 0.92),
                tp - 0.16,
                0.84,
                fill=False,
                edgecolor="red",
                linewidth=2.0,
                linestyle="--",
                zorder=3,
            )
        )


def _mark_rank(ax, pos, rank: Optional[int], stage_width: float) -> None:
    from matplotlib.patches import Rectangle

    if rank is not None and rank in pos:
        stage, lane, row = pos[rank]
        ax.add_patch(
            Rectangle(
                (stage * stage_width + lane + 0.05, -row - 0.95),
                0.9,
                0.9,
                fill=False,
                edgecolor="gold",
                linewidth=3.0,
                zorder=4,
            )
        )


def _outline_nodes(ax, pos: dict[int, tuple[int, int, int]], gpus_per_node: int, stage_width: float) -> None:
    """Thick lines along every cell side whose neighbour is absent or on another node."""
    from matplotlib.collections import LineCollection

    node_at = {cell: rank // gpus_per_node for rank, cell in pos.items()}
    segments = []
    for (stage, lane, row), node in node_at.items():
        x0 = stage * stage_width + lane
        x1, top, bottom = x0 + 1, -row, -row - 1
        for neighbour, segment in (
            ((stage, lane - 1, row), [(x0, bottom), (x0, top)]),
            ((stage, lane + 1, row), [(x1, bottom), (x1, top)]),
            ((stage, lane, row - 1), [(x0, top), (x1, top)]),
            ((stage, lane, row + 1), [(x0, bottom), (x1, bottom)]),
        ):
            if node_at.get(neighbour) != node:
                segments.append(segment)
    ax.add_collection(LineCollection(segments, colors="black", linewidths=2.2))


# --- every rank -------------------------------------------------------------------------------------
def _full_figure(layout: MeshLayout, color_dims, gpus_per_node, highlight_rank):
    from matplotlib.figure import Figure

    spec = layout.spec
    pos = cell_positions(layout)
    colour_of = _groups_of(layout, color_dims, list(pos))
    ep_of = _ep_index(layout, list(pos))
    crossing = _cross_node_tp_ranks(layout, gpus_per_node)
    tp, stages = spec.dim_size("tp"), spec.dim_size("pp")
    rows = max(row for _, _, row in pos.values()) + 1
    width = stages * (tp + STAGE_GAP)
    fig_width = max(4.0, width * CELL + 1)
    title, title_height = _title(
        fig_width,
        (spec.describe(), "; ".join(_legend(spec, color_dims, gpus_per_node, bool(crossing), highlight_rank))),
    )
    fig_height = max(2.5, rows * CELL + 1.4) + max(0.0, title_height - 0.4)
    fig = Figure(figsize=(fig_width, fig_height))
    ax = fig.add_axes((0.02, 0.02, 0.96, max(0.3, 0.98 - title_height / fig_height)))
    font = max(4.0, min(9.0, 9.0 * 16 / max(16, rows, width)))
    _draw_cells(ax, pos, colour_of, ep_of, tp + STAGE_GAP, highlight_rank, font)
    if gpus_per_node:
        _outline_nodes(ax, pos, gpus_per_node, tp + STAGE_GAP)
    _mark_crossing(ax, pos, crossing, tp, tp + STAGE_GAP)
    _mark_rank(ax, pos, highlight_rank, tp + STAGE_GAP)
    for stage in range(stages):
        ax.text(stage * (tp + STAGE_GAP) + tp / 2, 0.25, f"stage {stage}", ha="center", va="bottom", fontsize=font + 1)
    ax.set_xlim(-0.2, width)
    ax.set_ylim(-rows - 0.2, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(title, fontsize=TITLE_PT)
    return fig


# --- detail + overview ------------------------------------------------------------------------------
def _aggregated_figure(layout: MeshLayout, color_dims, gpus_per_node, highlight_rank):
    import matplotlib
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    spec = layout.spec
    ranks = np.asarray(spec.ranks)
    stage, lane, row = cell_arrays(layout)
    tp, stages = spec.dim_size("tp"), spec.dim_size("pp")
    rows_per_stage = spec.size // (tp * stages)
    lanes = min(tp, DETAIL_RANKS)
    detail_rows = max(1, min(rows_per_stage, DETAIL_RANKS // lanes))
    pack = max(1, 8 // lanes)  # narrow rows (tp < 8) sit side by side, ``pack`` per line
    lines = math.ceil(detail_rows / pack)
    width = lanes * min(pack, detail_rows)
    chosen = (stage == 0) & (row < detail_rows) & (lane < lanes)
    # drawn position: (0, x, line); each tp group stays one run of ``lanes`` cells
    pos = {
        int(r): (0, int((w % pack) * lanes + t), int(w // pack))
        for r, t, w in zip(ranks[chosen], lane[chosen], row[chosen])
    }
    colour_of = _groups_of(layout, color_dims, list(pos))
    ep_of = _ep_index(layout, list(pos))
    crossing = _cross_node_tp_ranks(layout, gpus_per_node)

    block = gpus_per_node or DEFAULT_BLOCK
    unit = "node" if gpus_per_node else f"block of {block} ranks"
    n_blocks = math.ceil(spec.size / block)
    # stage served by each block (-1: ranks of several stages)
    padded = np.full(n_blocks * block, -2, dtype=np.int64)
    padded[ranks - ranks[0]] = stage
    per_block = padded.reshape(n_blocks, block)
    valid = np.where(per_block >= 0, per_block, per_block.max(axis=1, keepdims=True))
    block_stage = np.where(valid.min(axis=1) == valid.max(axis=1), valid.max(axis=1), -1)
    crossing_blocks = sorted({(r - int(ranks[0])) // block for r in crossing})
    detail_blocks = sorted({(r - int(ranks[0])) // block for r in pos})

    columns = _columns(n_blocks, stages)
    grid_rows = math.ceil(n_blocks / columns)
    grid = np.full(grid_rows * columns, np.nan)
    grid[:n_blocks] = block_stage
    grid = grid.reshape(grid_rows, columns)

    # figure geometry (inches): detail panel width from its cells, overview about square cells
    detail_w = max(2.5, (width + 0.4) * CELL)
    detail_h = (lines + 1.2) * CELL
    cell_in = max(0.12, min(0.45, 7.0 / max(columns, grid_rows)))
    over_w, over_h = columns * cell_in + 1.6 + LEGEND_W, grid_rows * cell_in + 0.6
    legend_lines = [
        f"left: pipeline stage 0, rows 0-{detail_rows - 1} of {rows_per_stage}"
        + (f" ({pack} rows per line)" if pack > 1 and detail_rows > 1 else "")
        + (f", tp lanes 0-{lanes - 1} of {tp}" if lanes < tp else "")
        + f" ({len(pos)} of {spec.size} ranks; the other rows and stages repeat this pattern)",
        "; ".join(_legend(spec, color_dims, gpus_per_node, bool(crossing), highlight_rank)),
        f"right: every {unit} as one square, coloured by the pipeline stage it serves; "
        + ("red x: holds a tp group crossing nodes; " if crossing else "")
        + "black outline: ranks shown on the left",
    ]
    fig_width = max(8.0, detail_w + over_w + 0.8)
    title, title_height = _title(fig_width, [spec.describe()] + legend_lines)
    body_h = max(detail_h, over_h, 3.0)
    fig_height = body_h + title_height + 0.3
    fig = Figure(figsize=(fig_width, fig_height))
    top = 1 - (title_height + 0.1) / fig_height

    # left: detail
    ax = fig.add_axes((0.2 / fig_width, top - detail_h / fig_height, detail_w / fig_width, detail_h / fig_height))
    font = max(6.0, min(9.0, 9.0 * 8 / max(8, width)))
    _draw_cells(ax, pos, colour_of, ep_of, width + STAGE_GAP, highlight_rank, font)
    if gpus_per_node:
        _outline_nodes(ax, pos, gpus_per_node, width + STAGE_GAP)
    for x, y in sorted({(pos[r][1] // lanes * lanes, pos[r][2]) for r in crossing if r in pos}):
        from matplotlib.patches import Rectangle

        ax.add_patch(
            Rectangle(
                (x + 0.08, -y - 0.92),
                lanes - 0.16,
                0.84,
                fill=False,
                edgecolor="red",
                linewidth=2.0,
                linestyle="--",
                zorder=3,
            )
        )
    _mark_rank(ax, pos, highlight_rank, width + STAGE_GAP)
    first, last = min(pos), max(pos)
    ax.text(width / 2, 0.25, f"stage 0 (ranks {first}..{last} shown)", ha="center", va="bottom", fontsize=font + 1)
    if detail_rows < rows_per_stage:
        ax.text(
            width / 2,
            -lines - 0.15,
            f"... {rows_per_stage - detail_rows} more rows in this stage",
            ha="center",
            va="top",
            fontsize=font,
        )
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-lines - 1.0, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")

    # right: overview
    left = (detail_w + 1.2) / fig_width
    ax2 = fig.add_axes(
        (
            left,
            top - over_h / fig_height + 0.3 / fig_height,
            (over_w - 1.4 - LEGEND_W) / fig_width,
            (over_h - 0.6) / fig_height,
        )
    )
    # stage colours unlike the detail's tab20 group colours
    base = matplotlib.colormaps["Dark2" if stages <= 8 else "viridis"]
    colours = [base(i) if stages <= 8 else base(i / max(1, stages - 1)) for i in range(stages)]
    cmap = ListedColormap(["#bbbbbb"] + colours)  # index 0: a block of several stages
    shown = np.where(np.isnan(grid), np.nan, grid + 1)
    ax2.imshow(
        np.ma.masked_invalid(shown), cmap=cmap, vmin=-0.5, vmax=stages + 0.5, interpolation="nearest", aspect="equal"
    )
    ax2.set_xticks(np.arange(-0.5, columns, 1), minor=True)
    ax2.set_yticks(np.arange(-0.5, grid_rows, 1), minor=True)
    ax2.grid(which="minor", color="white", linewidth=0.6 if columns <= 64 else 0.2)
    ax2.tick_params(which="minor", length=0)
    step = max(1, math.ceil(grid_rows / 24))
    ticks = list(range(0, grid_rows, step))
    ax2.set_yticks(ticks)
    ax2.set_yticklabels(
        [f"{unit.split()[0]} {t * columns} (rank {int(ranks[0]) + t * columns * block})" for t in ticks], fontsize=7
    )
    xstep = max(1, math.ceil(columns / 16))
    ax2.set_xticks(list(range(0, columns, xstep)))
    ax2.set_xticklabels([f"+{c}" for c in range(0, columns, xstep)], fontsize=7)
    ax2.tick_params(which="major", length=2)
    if crossing_blocks:
        ys, xs = np.divmod(np.asarray(crossing_blocks), columns)
        ax2.scatter(xs, ys, marker="x", color="red", s=max(6.0, (cell_in * 72 * 0.6) ** 2), linewidths=1.0, zorder=3)
    from matplotlib.patches import Rectangle

    for b in detail_blocks:
        y, x = divmod(b, columns)
        ax2.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.6, zorder=4))
    if highlight_rank is not None and layout.contains(highlight_rank):
        y, x = divmod(layout.local_index(highlight_rank) // block, columns)
        ax2.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="gold", linewidth=2.4, zorder=5))
    for side in ax2.spines.values():
        side.set_visible(False)
    handles = (
        [Patch(color=colours[s], label=_stage_label(s, block_stage, unit)) for s in range(stages)]
        if stages <= 8
        else []
    )
    if (block_stage == -1).any():
        handles.append(Patch(color="#bbbbbb", label="several stages"))
    if handles:
        ax2.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    elif stages > 8:
        ax2.set_title(f"colour: stage 0 (dark blue) .. {stages - 1} (yellow)", fontsize=8)
    fig.suptitle(title, fontsize=TITLE_PT)
    return fig


def _stage_label(stage: int, block_stage: np.ndarray, unit: str) -> str:
    blocks = np.nonzero(block_stage == stage)[0]
    word = "nodes" if unit == "node" else "blocks"
    if not len(blocks):
        return f"stage {stage}: shares {word}"
    return (
        f"stage {stage}: {word} {blocks[0]}-{blocks[-1]}"
        if len(blocks) > 1
        else f"stage {stage}: {word[:-1]} {blocks[0]}"
    )


def _columns(n_blocks: int, stages: int) -> int:
    """Squares per overview row: a divisor of the blocks per stage (or of all blocks) near a square grid."""
    target = max(8.0, math.sqrt(n_blocks) * 1.3)
    for total in ((n_blocks // stages) if n_blocks % stages == 0 else 0, n_blocks):
        divisors = [d for d in range(8, 65) if total and total % d == 0 and target / 2 <= d <= target * 2]
        if divisors:
            return min(divisors, key=lambda d: abs(d - target))
    return min(n_blocks, max(16, math.ceil(math.sqrt(n_blocks))))
