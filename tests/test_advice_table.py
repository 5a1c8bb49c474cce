"""Advice comes from one catalog (``ds_mesh_advice/catalog.json``): MIGRATION.md's tables are
generated from it, the shim's warnings and the codemods' templates and ``TODOV1`` texts read it."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

import ds_mesh_advice

ROOT = pathlib.Path(__file__).resolve().parents[1]
GROUPS = "deepspeed.utils.groups."
TOPOLOGY = "deepspeed.runtime.pipe.topology."
sys.path.insert(0, str(ROOT / "tools"))
import migration_tables  # noqa: E402


def _migration_rows() -> list[str]:
    """The first cell of every 4-column legacy-API row of MIGRATION.md's tables, and of the mpu_internal table."""
    text = (ROOT / "MIGRATION.md").read_text(encoding="utf-8")
    found, header = [], None
    for line in text.splitlines():
        if line.startswith("| legacy API | replacement | codemod | notes |") or line.startswith(
            "| legacy call (receiver"
        ):
            header = line
        elif not line.startswith("|"):
            header = None
        elif header and not line.startswith("|---"):
            found.append(line[2:].split(" | ", 1)[0])
    return found


def test_migration_md_tables_are_the_generated_ones():
    text = (ROOT / "MIGRATION.md").read_text(encoding="utf-8")
    assert migration_tables.generated(text) == text, "run python tools/migration_tables.py --write"
    assert migration_tables.covered(text) == {s["id"] for s in ds_mesh_advice.sections()}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "migration_tables.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_every_migration_row_is_one_catalog_row():
    listed = _migration_rows()
    apis = [r.api for r in ds_mesh_advice.rows()]
    assert len(listed) == len(apis) >= 180
    assert sorted(listed) == sorted(apis)
    assert len(set(r.name for r in ds_mesh_advice.rows())) == len(apis), "two rows for one API"


def test_a_changed_row_makes_the_check_fail(monkeypatch):
    text = (ROOT / "MIGRATION.md").read_text(encoding="utf-8")
    sections = [dict(s, rows=[dict(r) for r in s["rows"]]) for s in ds_mesh_advice.sections()]
    sections[0]["rows"][0]["replacement"] += " (changed)"
    monkeypatch.setattr(ds_mesh_advice, "sections", lambda: sections)
    assert migration_tables.generated(text) != text


def test_rows_are_well_formed():
    for row in ds_mesh_advice.rows():
        assert row.action in ds_mesh_advice.ACTIONS, row
        assert row.replacement and row.anchor.startswith("legacy-"), row
        if row.mesh is not None:
            assert "<mesh>" in row.mesh and "`" not in row.mesh, row
        if row.section == "grid":
            assert row.form in ("call", "attribute", "class"), row
    assert len({k.id for k in ds_mesh_advice.kinds()}) == len(ds_mesh_advice.kinds()) >= 10


def test_the_shim_warns_with_the_catalogs_text():
    import compat.groups  # noqa: F401 (registers its legacy entries)
    import compat.topology  # noqa: F401
    from compat import deprecation

    checked = 0
    for name in ds_mesh_advice.table():
        entry = deprecation._ENTRIES.get(name)
        if entry is not None:
            assert entry.replacement == ds_mesh_advice.plain(name), name
            checked += 1
    assert checked >= 55
    # the advice that had drifted: a pipeline topology's warning named the mesh, the codemod pipeline_topology
    entry = deprecation._ENTRIES["deepspeed.runtime.pipe.topology.PipeDataParallelTopology"]
    assert "mesh_core.pipeline_topology(pp=P, dp=D)" in entry.text
    entry = deprecation._ENTRIES["deepspeed.utils.groups._get_model_parallel_world_size"]
    assert "for AutoTP" in entry.text and "1 without an mpu" in entry.text


def test_the_codemods_templates_and_todo_texts_read_the_catalog():
    from codemods._engine import todo_links
    from codemods.rules import _grid_api as grid_api
    from codemods.rules import groups_getters

    checked = 0
    for short, text in groups_getters.MANUAL.items():
        assert text == "use " + ds_mesh_advice.plain("deepspeed.utils.groups." + short), short
        checked += 1
    assert checked >= 15
    grid = {r.name.rsplit(".", 1)[1]: r for r in ds_mesh_advice.rows() if r.section == "grid"}
    for name, template in grid_api.METHODS.items():
        assert grid[name].form == "call" and template == grid[name].template(mesh="{m}"), name
    for name, template in grid_api.ATTRIBUTES.items():
        assert grid[name].form == "attribute" and template == grid[name].template(mesh="{m}"), name
    assert len(grid_api.METHODS) + len(grid_api.ATTRIBUTES) == sum(1 for r in grid.values() if r.mesh)
    for name, text in grid_api.MANUAL.items():
        assert text == grid[name].advice, name
    for name, template in groups_getters.SIMPLE.items():
        assert template == ds_mesh_advice.row("deepspeed.utils.groups." + name).template(), name
    for name, template in groups_getters.EXPERT.items():
        assert template == ds_mesh_advice.row("deepspeed.utils.groups." + name).template(), name
    assert todo_links.KIND_IDS == {k.kind: k.id for k in ds_mesh_advice.kinds()}


def test_explain_prints_a_row_and_says_what_is_valid():
    text = ds_mesh_advice.explain("_get_expert_parallel_group")
    assert "next step: use <mesh>.expert_groups(N).ep_group" in text and "MIGRATION.md#legacy-groups" in text
    assert "todov1-groups" in ds_mesh_advice.explain("todov1-groups")
    for item in (*ds_mesh_advice.rows(), *ds_mesh_advice.kinds()):  # every code answers, in lines of 100
        assert ds_mesh_advice.find(item.code)[-1 if isinstance(item, ds_mesh_advice.Row) else 0] == item, item.code
        assert max(len(line) for line in ds_mesh_advice.explain(item.code).splitlines()) <= ds_mesh_advice.WIDTH
    assert "no legacy API or TODOV1 kind" in ds_mesh_advice.explain("no_such_api")
    assert "`" not in ds_mesh_advice.plain("deepspeed.utils.groups._get_data_parallel_group")
    with pytest.raises(KeyError, match="catalog.json"):
        ds_mesh_advice.replacement("deepspeed.utils.groups.no_such_api")


def _unwrapped(text: str) -> str:
    return " ".join(text.split())


def test_every_warning_says_what_to_write_in_lines_of_100_and_its_code_explains():
    from codemods._engine import todo_links
    from compat import deprecation

    for row in ds_mesh_advice.rows():
        text = deprecation.message(row.name, row.advice, row.name)
        assert max(len(line) for line in text.splitlines()) <= ds_mesh_advice.WIDTH, text
        assert "…" not in text and _unwrapped(text).startswith(f"TODOV1: {row.name} is deprecated; {row.next_step}")
        assert row.next_step in _unwrapped(text), text
        assert todo_links.has_next_step(row.next_step), row.name
        code = _unwrapped(text).rsplit("(ds-migrate --explain ", 1)[1].removesuffix(")").strip("'")
        assert row in ds_mesh_advice.find(code), (code, row.name)


def test_the_shim_and_the_codemod_say_the_same_for_each_api():
    """The shim's warning and the codemod's comment for one legacy API carry its catalog row's next step."""

    import compat.groups  # noqa: F401 (registers its legacy entries)
    import compat.topology  # noqa: F401
    from codemods import migrate_code
    from codemods.rules import groups_getters
    from compat import deprecation

    compared = 0
    for short in groups_getters.MANUAL:
        row = ds_mesh_advice.row(GROUPS + short)
        code = migrate_code(f"from deepspeed.utils import groups\nx = groups.{short}()\n").code
        comment = re.search(r"# TODOV1: (.*); ds-migrate --explain (\S+)", code)
        assert comment and comment.group(1) == row.next_step, (short, code)
        assert row.next_step in _unwrapped(deprecation._ENTRIES[GROUPS + short].text), short
        compared += 1
    for name in (
        "ProcessTopology",
        "PipeDataParallelTopology",
        "PipeModelDataParallelTopology",
        "PipelineParallelGrid",
    ):
        row = ds_mesh_advice.row(TOPOLOGY + name)
        assert row.next_step in _unwrapped(deprecation._ENTRIES[TOPOLOGY + name].text), name
        compared += 1
    assert compared >= 24


def test_the_mpu_warning_writes_the_mesh_section_of_the_adopted_layout():
    from compat.initialize import mpu_advice
    from mesh_core import MeshSpec

    assert mpu_advice(MeshSpec.build(8, pp=2, dp=2, tp=2)).startswith(
        'put "mesh": {"pp": 2, "dp": 2, "tp": 2} in the config (this mpu\'s layout) and drop mpu=, with '
        '"tensor_parallel": {"autotp_size": 0}'
    )
    assert '"order": ["tp", "dp"]' in mpu_advice(MeshSpec.build(4, order=("tp", "dp"), tp=2, dp=2))
    assert (
        mpu_advice(MeshSpec.build(4, dp=4)) == 'put "mesh": {"dp": 4} in the config (this mpu\'s layout) and drop mpu='
    )


def test_every_shim_warning_reads_a_catalog_row():
    """Each ``legacy_entry`` / ``warn_legacy`` / ``_warn_user`` call in compat names a catalog row
    (its ``row``, else its legacy name) or takes its text from ``ds_mesh_advice``; the launcher's
    ``--log_level`` line names its ``ds-migrate --explain`` code."""
    import ast

    checked = 0
    for path in sorted((ROOT / "compat").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                not (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None))
                    in ("legacy_entry", "warn_legacy", "_warn_user")
                )
                or path.name == "deprecation.py"
            ):
                continue
            if len(node.args) < 2 or isinstance(node.args[0], ast.Name):
                continue  # a forwarding helper's own parameters
            row = next((k.value for k in node.keywords if k.arg == "row"), node.args[2] if len(node.args) > 2 else None)
            row = row if row is not None else node.args[0]
            if isinstance(row, ast.Constant):
                assert ds_mesh_advice.row(row.value), (path.name, node.lineno)
            else:
                assert "ds_mesh_advice" in ast.unparse(node.args[1]), (path.name, node.lineno, ast.unparse(node))
            checked += 1
    assert checked >= 6
    text = (ROOT / "compat" / "logging_tree.py").read_text(encoding="utf-8")
    assert "ds-migrate --explain launcher-log_level" in text and ds_mesh_advice.find("launcher-log_level")
