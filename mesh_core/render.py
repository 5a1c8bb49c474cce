"""Draw a layout's rank grid (SVG or PNG) with matplotlib, the optional ``plot`` extra.

Pipeline stages are columns of cells; inside a stage, each row holds one tp block (the tp
coordinate runs left to right) and rows run over the remaining dims (dp, sp). Cells are coloured
by their group along ``color_by``; thick black outlines enclose each node's ranks, red dashes
mark tp groups that cross a node, and ``e<i>`` labels name each rank's EP group.
"""

from __future__ import annotations

import logging
import textwrap
from typing import Optional, Sequence

from .layout import MeshLayout
from .spec import MeshSpec, MeshSpecError

logger = logging.getLogger(__name__)

MAX_DRAWN_RANKS = 4096
CELL = 0.55  # inches per rank cell
STAGE_GAP = 0.6  # cells between pipeline stage columns
TITLE_PT = 9  # title font size (points)


def default_color_dims(spec: MeshSpec) -> tuple[str, ...]:
    """tp when the mesh has it (tp blocks stand out), else dp."""
    return ("tp",) if spec.dim_size("tp") > 1 else ("dp",)


def cell_positions(layout: MeshLayout) -> dict[int, tuple[int, int, int]]:
    """rank -> (stage, tp coordinate, row) of its cell; the row indexes the remaining dims."""
    spec = layout.spec
    rest = tuple(n for n in spec.names if n not in ("pp", "tp"))
    positions = {}
    for rank in spec.ranks:
        coord = layout.coordinate(rank)
        stage, lane = coord.get("pp", 0), coord.get("tp", 0)
        row = layout.coordinate_of(rank, rest) if rest and layout.normalize(rest) else 0
        positions[rank] = (stage, lane, row)
    return positions


def draw_mesh(
    spec: MeshSpec,
    path: str,
    *,
    fmt: Optional[str] = None,
    gpus_per_node: Optional[int] = None,
    color_by: Optional[Sequence[str]] = None,
    highlight_rank: Optional[int] = None,
) -> None:
    """Write the rank-grid picture of ``spec`` to ``path`` (format from ``fmt`` or the suffix)."""
    if spec.size > MAX_DRAWN_RANKS:
        raise MeshSpecError(
            f"the mesh has {spec.size} ranks; pictures are limited to {MAX_DRAWN_RANKS} ranks "
            "(use --json for larger worlds)"
        )
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        raise ImportError("drawing needs matplotlib: pip install 'ds-mesh[plot]' (or pip install matplotlib)") from None
    import matplotlib

    layout = MeshLayout(spec)
    color_dims = tuple(color_by) if color_by else default_color_dims(spec)
    colour_groups = layout.groups_array(color_dims)  # validates the dim names
    colour_of = {int(r): i for i, group in enumerate(colour_groups) for r in group}
    palette = matplotlib.colormaps["tab20"]
    ep_of = {int(r): i for i, g in enumerate(layout.groups_array("ep")) for r in g} if spec.ep > 1 else {}
    crossing = _cross_node_tp_ranks(layout, gpus_per_node)
    pos = cell_positions(layout)

    tp = spec.dim_size("tp")
    stages = spec.dim_size("pp")
    rows = max(row for _, _, row in pos.values()) + 1
    width = stages * (tp + STAGE_GAP)
    legend = [f"colour: {','.join(color_dims)} group"]
    if ep_of:
        legend.append("e<i>: EP group")
    if gpus_per_node:
        legend.append(f"black outline: node ({gpus_per_node} GPUs)")
        if crossing:
            legend.append("red dashes: tp group crossing nodes")
    if highlight_rank is not None:
        legend.append(f"gold: rank {highlight_rank}")
    fig_width = max(4.0, width * CELL + 1)
    chars = int(fig_width * 72 / (TITLE_PT * 0.62))  # characters per line: about 0.6 em each
    title = "\n".join(textwrap.fill(line, chars) for line in (spec.describe(), "; ".join(legend)))
    title_height = (title.count("\n") + 1) * TITLE_PT * 1.4 / 72 + 0.2  # inches
    fig_height = max(2.5, rows * CELL + 1.4) + max(0.0, title_height - 0.4)
    fig = Figure(figsize=(fig_width, fig_height))
    ax = fig.add_axes((0.02, 0.02, 0.96, max(0.3, 0.98 - title_height / fig_height)))
    font = max(4.0, min(9.0, 9.0 * 16 / max(16, rows, width)))
    for rank, (stage, lane, row) in pos.items():
        x = stage * (tp + STAGE_GAP) + lane
        face = palette(colour_of[rank] % palette.N)
        ax.add_patch(Rectangle((x, -row - 1), 1, 1, facecolor=face, edgecolor="white", linewidth=0.8))
        label = str(rank) + (f"\ne{ep_of[rank]}" if rank in ep_of else "")
        weight = "bold" if rank == highlight_rank else "normal"
        ax.text(x + 0.5, -row - 0.5, label, ha="center", va="center", fontsize=font, fontweight=weight)
    if gpus_per_node:
        _outline_nodes(ax, pos, gpus_per_node, tp + STAGE_GAP)
    for stage, row in sorted({pos[r][::2] for r in crossing}):  # a tp group is one row of one stage
        x = stage * (tp + STAGE_GAP)
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
    if highlight_rank is not None and highlight_rank in pos:
        stage, lane, row = pos[highlight_rank]
        ax.add_patch(
            Rectangle(
                (stage * (tp + STAGE_GAP) + lane + 0.05, -row - 0.95),
                0.9,
                0.9,
                fill=False,
                edgecolor="gold",
                linewidth=3.0,
                zorder=4,
            )
        )
    for stage in range(stages):
        ax.text(stage * (tp + STAGE_GAP) + tp / 2, 0.25, f"stage {stage}", ha="center", va="bottom", fontsize=font + 1)
    ax.set_xlim(-0.2, width)
    ax.set_ylim(-rows - 0.2, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(title, fontsize=TITLE_PT)
    fig.savefig(path, format=fmt)
    logger.info("wrote %s", path)


def _cross_node_tp_ranks(layout: MeshLayout, gpus_per_node: Optional[int]) -> set[int]:
    if not gpus_per_node or layout.spec.dim_size("tp") == 1:
        return set()
    groups = layout.groups_array("tp")
    nodes = groups // gpus_per_node
    return {int(r) for r in groups[nodes.min(axis=1) != nodes.max(axis=1)].ravel()}


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
