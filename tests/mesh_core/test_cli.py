"""`mesh show`: output checked against DeepSpeed 0.19.8's own topology and group builders."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshSpec
from mesh_core.__main__ import main

pytestmark = pytest.mark.torch_releases


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def show_json(argv, capsys):
    code, out, err = run(["show", "--json", *argv], capsys)
    assert code == 0, err
    return json.loads(out)


def topology(pp, tp, dp):
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    return PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)


def test_bare_show_prints_the_builtin_example(capsys):
    code, out, err = run([], capsys)
    assert code == 0 and err == ""
    assert "MeshSpec(pp=2, dp=4, tp=2, ep=2; ranks 0..15 of world 16)" in out
    assert "nodes: 2 x 8 GPUs" in out
    for section in ("groups per dim", "rank -> coordinate", "communicators (new_group calls)"):
        assert section in out
    assert main(["show"]) == 0


@pytest.mark.deepspeed
def test_groups_and_coordinates_match_deepspeed_topology(capsys):
    report = show_json(["-w", "24", "--pp", "2", "--tp", "3"], capsys)
    topo = topology(pp=2, tp=3, dp=4)
    groups = {d["dims"]: d["groups"] for d in report["dims"]}
    assert groups["pp"] == topo.get_axis_comm_lists("pipe")
    assert groups["dp"] == topo.get_axis_comm_lists("data")
    assert groups["tp"] == topo.get_axis_comm_lists("model")
    for row in report["coordinates"]:
        coord = topo.get_coord(row["rank"])
        assert (row["pp"], row["dp"], row["tp"]) == (coord.pipe, coord.data, coord.model)


@pytest.mark.deepspeed
def test_counts_match_the_real_mesh_and_the_real_deepspeed(capsys):
    """The default example's printed counts, against new_group calls recorded on the fake backend."""
    comm = show_json([], capsys)["communicators"]
    world, rank = 16, 15
    with fake_world(rank, world, deepspeed_comm=True):
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid
        from deepspeed.utils import groups

        with record_new_groups() as legacy_calls, contextlib.redirect_stdout(io.StringIO()):
            grid = PipelineParallelGrid(topology=topology(pp=2, tp=2, dp=4))
            groups.mpu = grid
            groups._create_expert_data_and_model_parallel(2, mpu=grid)
    per_rank_calls = {}
    for r in range(world):  # member-only creation: each rank creates only its own groups
        with fake_world(r, world), record_new_groups() as mesh_calls:
            DeepSpeedDeviceMesh(MeshSpec.build(world, pp=2, tp=2, ep=2))
        per_rank_calls[r] = mesh_calls
    assert comm["legacy"]["world"] == len(legacy_calls)
    assert comm["mesh"]["world"] == len({tuple(g) for calls in per_rank_calls.values() for g in calls if len(g) > 1})
    assert comm["mesh"]["per_rank"] == len(per_rank_calls[0])
    rank_comm = show_json(["--rank", str(rank)], capsys)["communicators"]
    assert rank_comm["legacy"]["per_rank"] == sum(1 for g in legacy_calls if rank in g)
    assert rank_comm["mesh"]["per_rank"] == sum(1 for g in mesh_calls if rank in g)
    # calls each rank issues: legacy's collective new_group makes every rank call every group
    assert rank_comm["legacy"]["calls_on_rank"] == len(legacy_calls)
    assert rank_comm["mesh"]["calls_on_rank"] == len(per_rank_calls[rank])


@pytest.mark.deepspeed
def test_rank_view_matches_the_legacy_grid(capsys):
    rank = 13
    view = show_json(["-w", "16", "--pp", "2", "--tp", "2", "--rank", str(rank)], capsys)["rank_view"]
    with fake_world(rank, 16, deepspeed_comm=True):
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid

        grid = PipelineParallelGrid(topology=topology(pp=2, tp=2, dp=4))
        assert view["groups"]["tp"]["ranks"] == grid.slice_group
        assert view["groups"]["dp"]["ranks"] == grid.dp_group
        assert view["groups"]["pp"]["ranks"] == grid.pp_group
        assert view["groups"]["dp"]["index"] == grid.get_data_parallel_rank()
        assert view["next_stage"] == grid.p2p_groups[rank][1]
    _, out, _ = run(["show", "-w", "16", "--pp", "2", "--tp", "2", "--rank", str(rank)], capsys)
    assert f"rank {rank}: pp=1, dp=2, tp=1" in out
    assert "rank -> coordinate" not in out


def test_expert_groups_follow_deepspeed_expert_tensor_layout(capsys):
    report = show_json(["-w", "16", "--tp", "2", "--ep", "4"], capsys)
    groups = {d["dims"]: d["groups"] for d in report["dims"]}
    # legacy_api.md worked example "expert-TP, mpu tp=2, ep=4" (W=16), as sets
    assert sorted(groups["ep"]) == sorted([[0, 2, 4, 6], [8, 10, 12, 14], [1, 3, 5, 7], [9, 11, 13, 15]])
    assert sorted(groups["edp"]) == sorted([[0, 8], [2, 10], [4, 12], [6, 14], [1, 9], [3, 11], [5, 13], [7, 15]])


def test_tp_crossing_nodes_warns(capsys):
    code, out, _ = run(["show", "-w", "24", "--tp", "4", "--gpus-per-node", "6"], capsys)
    assert code == 0
    crossing = [g for g in ([r, r + 1, r + 2, r + 3] for r in range(0, 24, 4)) if g[0] // 6 != g[-1] // 6]
    assert f"warning: {len(crossing)} of 6 tp groups cross a node boundary" in out
    _, aligned, _ = run(["show", "-w", "24", "--tp", "4", "--gpus-per-node", "8"], capsys)
    assert "warning" not in aligned
    report = show_json(["-w", "24", "--tp", "4", "--gpus-per-node", "6"], capsys)
    assert {d["dims"]: d["cross_node_groups"] for d in report["dims"]}["tp"] == len(crossing)
    assert report["nodes"] == 4 and len(report["warnings"]) == 1


def test_large_world_is_summarised_unless_all(capsys):
    code, out, _ = run(["show", "-w", "65536", "--pp", "16", "--tp", "8", "--ep", "8"], capsys)
    assert code == 0
    assert len(out.splitlines()) < 80
    assert "(8192 groups)" in out and "65535" in out
    _, every, _ = run(["show", "-w", "256", "--tp", "2", "--all"], capsys)
    tp_groups = [f"[{r},{r + 1}]" for r in range(0, 256, 2)]
    assert all(g in every for g in tp_groups)
    assert len([line for line in every.splitlines() if line.strip().split(" ")[0].isdigit()]) == 256


def test_config_file(tmp_path, capsys):
    path = tmp_path / "ds_config.json"
    path.write_text(
        json.dumps({"train_batch_size": 8, "sequence_parallel_size": 2, "tensor_parallel": {"autotp_size": 2}})
    )
    report = show_json(["--config", str(path), "-w", "16", "--pp", "2"], capsys)
    assert report["shape"] == {"pp": 2, "dp": 2, "sp": 2, "tp": 2}
    assert "dp,sp" in {d["dims"] for d in report["dims"]}
    path.write_text(json.dumps({"mesh": {"tp": 2, "ep": 2}}))
    assert show_json(["--config", str(path), "-w", "8"], capsys)["ep"] == 2


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["-w", "8", "--tp", "3"], "tp=3"),
        (["-w", "8", "--tp", "x"], "'x' is not a size"),
        (["--tp", "2"], "--world-size is required"),
        (["-w", "8", "--rank", "8"], "--rank 8"),
        (["-w", "8", "--gpus-per-node", "0"], "--gpus-per-node 0"),
        (["--config", "/nonexistent/ds.json", "-w", "8"], "/nonexistent/ds.json"),
        (["--config", "/nonexistent/ds.json"], "--config needs --world-size"),
        (["-w", "8", "--order", "pp,tp,zz"], "zz"),
        (["-w", "8", "--ep", "3"], "ep=3"),
        (["-w", "8", "--order", ","], "--order ',' names no dim"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(argv, needle, capsys):
    code, out, err = run(["show", *argv], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("mesh: error: ") and needle in err


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"[1, 2]", "must be a JSON object"),
        (b"null", "must be a JSON object"),
        (b"\xff\xfe{}", "cannot read --config"),
        (b'{"tensor_parallel": 5}', "config key 'tensor_parallel' must be a dict, got 5"),
        (b'{"sequence_parallel_size": "abc"}', "'abc'"),
        (b'{"data_parallel_size": [1]}', "config key 'data_parallel_size'=[1] is not valid"),
        (b'{"mesh": {"ep": "x"}}', "'x'"),
        (b'{"mesh": {"tp": 3}}', "mesh: error: tp=3 does not divide world_size=8"),
    ],
)
def test_bad_config_file_is_one_clear_line_and_exit_2(content, needle, tmp_path, capsys):
    path = tmp_path / "ds_config.json"
    path.write_bytes(content)
    code, out, err = run(["show", "--config", str(path), "-w", "8"], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("mesh: error: ") and needle in err


@pytest.mark.parametrize("flag", ["--svg", "--png"])
def test_unwritable_picture_path_is_one_clear_line_and_exit_2(flag, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    target = tmp_path / "missing" / "mesh.out"
    code, out, err = run(["show", "-w", "8", flag, str(target)], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("mesh: error: ") and str(target) in err


def test_svg_and_png_pictures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    svg, png = tmp_path / "mesh.svg", tmp_path / "mesh.png"
    code, out, _ = run(
        [
            "show",
            "-w",
            "16",
            "--pp",
            "2",
            "--tp",
            "4",
            "--ep",
            "2",
            "-g",
            "6",
            "--svg",
            str(svg),
            "--png",
            str(png),
            "--rank",
            "5",
        ],
        capsys,
    )
    assert code == 0 and f"picture: {svg}" in out
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run(["show", "-w", "131072", "--svg", str(svg)], capsys)
    assert code == 2 and "65536" in err


def test_cell_positions_put_stages_in_columns_and_tp_in_rows():
    from mesh_core.cli.render import cell_positions
    from mesh_core.layout import MeshLayout

    pos = cell_positions(MeshLayout(MeshSpec.build(16, pp=2, tp=2)))
    assert pos[0] == (0, 0, 0) and pos[1] == (0, 1, 0) and pos[2] == (0, 0, 1)
    assert pos[8] == (1, 0, 0) and pos[15] == (1, 1, 3)


def test_python_dash_m_entry_point():
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "mesh_core", "show", "-w", "8", "--tp", "2", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["shape"] == {"dp": 4, "tp": 2}
    bad = subprocess.run(
        [sys.executable, "-m", "mesh_core", "show", "-w", "8", "--tp", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "tp=3" in bad.stderr


def test_a_reader_closing_the_pipe_early_is_no_traceback():
    proc = subprocess.Popen(
        [sys.executable, "-m", "mesh_core", "show", "-w", "4096", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    proc.stdout.read(200)  # like `mesh show ... | head`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err


@pytest.mark.parametrize("argv", [["-w", "16", "--dp-replicate", "2", "--dp-shard", "4", "--tp", "2"], ["-w", "2"]])
def test_picture_title_fits_in_the_picture(argv, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    saved = saved_figures(monkeypatch)
    code, _, err = run(["show", *argv, "--png", str(tmp_path / "m.png")], capsys)
    assert code == 0, err
    (fig,) = saved
    renderer = FigureCanvasAgg(fig).get_renderer()
    box, title = fig.bbox, fig._suptitle.get_window_extent(renderer)
    assert box.x0 <= title.x0 and title.x1 <= box.x1 and title.y1 <= box.y1, (title, box)


# --- at scale (issue 13) -----------------------------------------------------------------------
def saved_figures(monkeypatch):
    from matplotlib.figure import Figure

    saved = []
    real_savefig = Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def rank_labels(fig) -> list[int]:
    return [
        int(t.get_text().split()[0])
        for ax in fig.axes
        for t in ax.texts
        if t.get_text().split() and t.get_text().split()[0].isdigit()
    ]


@pytest.mark.parametrize(
    "argv,kind,labels",
    [
        (["-w", "16", "--pp", "2", "--tp", "2", "--ep", "2", "-g", "8"], "full", 16),
        (["-w", "512", "--pp", "4", "--tp", "8", "-g", "8"], "aggregated", 64),
        (["-w", "4096", "--pp", "8", "--tp", "8", "--ep", "4", "-g", "8", "--rank", "3000"], "aggregated", 64),
        (["-w", "1024"], "aggregated", 64),  # dp only: 64 one-rank rows, 8 per line
    ],
)
def test_pictures_draw_every_rank_only_when_small(argv, kind, labels, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    saved = saved_figures(monkeypatch)
    png = tmp_path / "m.png"
    code, out, err = run(["show", *argv, "--png", str(png)], capsys)
    assert code == 0, err
    (fig,) = saved
    shown = rank_labels(fig)
    assert len(shown) == labels and len(set(shown)) == labels
    assert (len(fig.axes) == 1) == (kind == "full")  # aggregated: detail + overview panels
    if kind == "aggregated":
        detail, overview = fig.axes[:2]
        (image,) = overview.images
        world = int(argv[1])
        assert image.get_array().count() == world // 8  # one square per node (8 GPUs or a block of 8)
        width, height = fig.get_size_inches()
        assert width * height < 400  # bounded, whatever the world
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_aggregated_picture_marks_nodes_with_crossing_tp_groups(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    saved = saved_figures(monkeypatch)
    code, _, err = run(
        ["show", "-w", "480", "--pp", "4", "--tp", "4", "-g", "6", "--png", str(tmp_path / "m.png")], capsys
    )
    assert code == 0, err
    overview = saved[0].axes[1]
    (crosses,) = overview.collections
    # 40 of 120 tp groups cross nodes; every one of the 80 nodes holds a member of one
    assert len(crosses.get_offsets()) == 80


def test_huge_world_is_one_clear_error(capsys):
    code, out, err = run(["show", "-w", "100000000", "--tp", "8"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("mesh: error: --world-size 100000000 is above") and "1048576" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run(["show", "-w", "131072", "--all"], capsys)
    assert code == 2 and "--all lists every group and rank up to 65536 ranks" in err


def test_gpus_per_node_not_dividing_the_world_is_reported(capsys):
    code, out, _ = run(["show", "-w", "100", "--tp", "4", "-g", "8"], capsys)
    assert code == 0
    assert "nodes: 12 x 8 GPUs + 1 node with 4 of 8 GPUs used" in out
    assert (
        "warning: --gpus-per-node 8 does not divide the world of 100 ranks: 12 full nodes and one with 4 ranks" in out
    )
    report = show_json(["-w", "4", "-g", "8"], capsys)
    assert report["nodes"] == 1 and "more than the 4 ranks" in report["warnings"][0]


@pytest.mark.parametrize("flag,name,hint", [("--png", "mesh.jpg", "mesh.png"), ("--svg", "mesh.png", "--png mesh.png")])
def test_picture_name_must_match_its_format(flag, name, hint, tmp_path, capsys):
    target = tmp_path / name
    code, out, err = run(["show", "-w", "16", flag, str(target)], capsys)
    assert code == 2 and out == "" and hint.replace("mesh", str(tmp_path / "mesh")) in err
    assert not target.exists()


def table_rows(lines: list[str], title: str) -> list[str]:
    rows = []
    for line in lines[lines.index(title) + 1 :]:
        if not line.strip():
            break
        if not line.strip().startswith(("[", "...")):  # group listings and the elision row
            rows.append(line)
    return rows


def test_tables_stay_aligned_with_wide_numbers(capsys):
    code, out, _ = run(["show", "-w", "131072", "--pp", "2", "--tp", "8", "--ep", "4", "-g", "8"], capsys)
    assert code == 0
    lines = out.splitlines()
    for title, count in (("rank -> coordinate", 17), ("groups per dim", 6)):
        rows = table_rows(lines, title)
        assert len(rows) == count, rows
        assert len({len(r) for r in rows}) == 1, rows  # every row as wide as the header
        header = rows[0]
        ends = [i for i, c in enumerate(header) if c != " " and (i + 1 == len(header) or header[i + 1] == " ")]
        for row in rows[1:]:  # numbers are right-aligned under their header
            assert all(row[i] != " " for i in ends[1:]), (header, row)
    assert "  131071 16383   1 8191   7   3 2047" in out  # last coordinate row, wide numbers
