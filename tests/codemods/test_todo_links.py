"""What ``ds-migrate`` says: short ``# TODOV1:`` comments whose MIGRATION.md section exists, each one
listed as ``file:line`` with its full advice, ``--json`` alone on stdout, ``--help`` naming the
command the user typed."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codemods import todo_links
from codemods.pipeline import migrate_code

REPO = Path(__file__).resolve().parent.parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "codemods"
# sites of several kinds, each left with a TODOV1 (long advice included)
LEGACY = """from deepspeed.utils import groups
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology


def f(mpu, name):
    a = groups._get_max_expert_size()
    b = getattr(groups, name)()
    c = groups._get_expert_parallel_group(name)
    return groups._get_data_parallel_world_size()


def g(pp, mp, world):
    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=world // (pp * mp))
    initialize_model_parallel(topology=topo)
"""


def _todo_comments(code: str) -> list[str]:
    return [line[line.index("# TODOV1:"):] for line in code.splitlines() if "# TODOV1:" in line]


def _written_comments() -> list[str]:
    """The TODOV1 comments the codemods write on this file's example and every fixture."""
    sources = [LEGACY] + [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.rglob("*.py"))
                          if not p.name.endswith(".expected.py")]
    comments = []
    for source in sources:
        try:
            code = migrate_code(source).code
        except Exception:  # fixtures that do not parse on purpose
            continue
        comments += [c for c in _todo_comments(code) if c not in source]  # not one a human wrote
    return comments


def test_every_todo_comment_is_short_and_links_an_existing_section():
    migration = (REPO / "MIGRATION.md").read_text(encoding="utf-8")
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', migration))
    comments = _written_comments()
    assert len(comments) >= 10
    for comment in comments:
        assert len(comment) <= todo_links.MAX_COMMENT, comment
        ids = re.search(r"; see MIGRATION\.md#(\S+)$", comment)
        assert ids, comment
        for anchor in ids.group(1).replace(" ", "").split(",#"):
            assert anchor in anchors, (anchor, comment)


def test_every_kind_of_site_has_its_section():
    kinds = set()
    for path in (REPO / "codemods").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if any(isinstance(t, ast.Name) and t.id.startswith("KIND") for t in node.targets):
                    kinds.add(node.value.value)
    assert kinds and kinds <= set(todo_links.KIND_IDS), kinds - set(todo_links.KIND_IDS)
    migration = (REPO / "MIGRATION.md").read_text(encoding="utf-8")
    for anchor in todo_links.KIND_IDS.values():
        assert f'<a id="{anchor}"></a>' in migration, anchor


def test_the_full_advice_is_kept_for_each_comment():
    m = migrate_code(LEGACY)
    assert m.todos and set(_todo_comments(m.code)) == set(m.advice)
    full = m.spelled_out()
    assert "track the largest ep size N yourself and use <mesh>.expert_groups(N)" in full
    assert "mesh_core.pipeline_topology(pp=pp, tp=mp, dp=world // (pp * mp))" in full
    assert max(len(c) for c in _todo_comments(full)) > todo_links.MAX_COMMENT  # what is kept off the line


def test_shorten_cuts_at_a_clause_or_a_word():
    assert todo_links.shorten("short", 50) == "short"
    text = "groups.x kept: a long explanation of why the site cannot be rewritten safely here"
    assert todo_links.shorten(text, 40) == "groups.x kept: a long explanation of…"
    assert todo_links.shorten("alpha beta: " + "x" * 60, 30).startswith("alpha beta")


def _run(args, cwd, argv0=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CODEMODS_CACHE_DIR": str(cwd / ".cache")}
    code = "import sys; from codemods.migrate import main; sys.exit(main())"
    if argv0 is not None:  # as the console script: sys.argv[0] is its path
        code = f"import sys; sys.argv[0] = {argv0!r}; " + code
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_run_lists_each_todo_it_wrote_as_file_line(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    done = _run(["train.py", "--no-progress"], tmp_path)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "train.py").read_text().splitlines()
    listed = re.findall(r"^train\.py:(\d+): TODOV1: (.*) \(see MIGRATION\.md#(\S+)\)$", done.stderr, re.M)
    todo_lines = [n for n, line in enumerate(written, 1) if "# TODOV1:" in line]
    assert [int(n) for n, _, _ in listed] == todo_lines and len(todo_lines) == 4
    for n, advice, anchor in listed:
        comment = written[int(n) - 1]
        assert anchor in comment and advice.startswith(comment.split("# TODOV1: ")[1].split("…")[0].split("; see")[0])
    assert "mesh_core.pipeline_topology(pp=pp, tp=mp, dp=world // (pp * mp))" in done.stderr  # the full advice


def test_diff_json_puts_json_alone_on_stdout(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    done = _run(["train.py", "--diff", "--json", "--no-progress"], tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert out["files_changed"] == 1 and "+from mesh_core import" in out["diffs"]["train.py"]
    assert [t["line"] for t in out["todos"]] and all(t["path"] == "train.py" and t["advice"] for t in out["todos"])
    assert (tmp_path / "train.py").read_text() == LEGACY  # --diff writes nothing


@pytest.mark.parametrize("argv0, prog", [("/venv/bin/ds-migrate", "ds-migrate"),
                                         (str(REPO / "codemods" / "migrate.py"), "python -m codemods.migrate")])
def test_help_names_the_command_typed_and_has_no_markup(tmp_path, argv0, prog):
    done = _run(["--help"], tmp_path, argv0=argv0)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: {prog} "), done.stdout[:200]
    assert "``" not in done.stdout and ":class:" not in done.stdout and ":func:" not in done.stdout
