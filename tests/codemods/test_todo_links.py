"""What ``ds-migrate`` says: short ``# TODOV1:`` comments that name what to write, never cut, with a
``ds-migrate --explain <code>`` that answers from the installed package; each one listed as
``file:line`` with its full advice, ``--json`` alone on stdout, ``--help`` naming the command the user
typed."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ds_mesh_advice
from codemods import migrate_code
from codemods._engine import todo_links
from codemods._engine.todo_wrap import unwrap

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
    """Each TODOV1 comment of ``code`` (one wrapped over lines joined)."""
    return [line[line.index("# TODOV1:") :] for line in unwrap(code).splitlines() if "# TODOV1:" in line]


def _written_comments() -> list[str]:
    """The TODOV1 comments the codemods write on this file's example and every fixture."""
    sources = [LEGACY] + [
        p.read_text(encoding="utf-8") for p in sorted(FIXTURES.rglob("*.py")) if not p.name.endswith(".expected.py")
    ]
    comments = []
    for source in sources:
        try:
            code = migrate_code(source).code
        except Exception:  # fixtures that do not parse on purpose
            continue
        comments += [c for c in _todo_comments(code) if c not in source]  # not one a human wrote
    return comments


def test_every_todo_comment_is_short_names_what_to_write_and_its_code_explains():
    comments = _written_comments()
    assert len(comments) >= 10
    for comment in comments:
        assert len(comment) <= todo_links.MAX_COMMENT, comment
        assert "…" not in comment, comment
        body, code = re.fullmatch(r"# TODOV1: (.*); ds-migrate --explain (\S+)", comment).groups()
        assert todo_links.has_next_step(body), comment
        assert re.search(r"[(<\"]|\w\.\w", body), f"no code or config named: {comment}"
        assert ds_mesh_advice.find(code), (code, comment)
        assert body.count("(") == body.count(")") and body.count('"') % 2 == 0, f"cut inside code: {comment}"


def test_every_kind_of_site_has_its_section():
    kinds = set()
    for path in (REPO / "codemods").rglob("*.py"):
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
    assert ds_mesh_advice.plain("deepspeed.utils.groups._get_max_expert_size") in full  # the one advice table
    assert "mesh_core.pipeline_topology(pp=pp, tp=mp, dp=world // (pp * mp))" in full
    assert max(len(c) for c in _todo_comments(full)) > todo_links.MAX_COMMENT  # what is kept off the line


def test_the_comment_keeps_the_site_advice_or_a_whole_clause_of_it():
    short = todo_links.todo_comment([("groups getter", 'groups.f: use <mesh>.size("dp")')])
    assert short == '# TODOV1: groups.f: use <mesh>.size("dp"); ds-migrate --explain groups'
    long = "topology kept: " + "x " * 40 + "; hand it mesh_core.pipeline_topology(pp=2, dp=2); more reasons"
    assert todo_links.todo_comment([("pipeline topology", long)]) == (
        "# TODOV1: hand it mesh_core.pipeline_topology(pp=2, dp=2); ds-migrate --explain topology"
    )
    hpz = "groups._get_zero_param_intra_parallel_group: use " + ds_mesh_advice.plain(
        "deepspeed.utils.groups._get_zero_param_intra_parallel_group"
    )
    row = ds_mesh_advice.row("deepspeed.utils.groups._get_zero_param_intra_parallel_group")
    assert todo_links.todo_comment([("groups getter", hpz)]).startswith(f"# TODOV1: {row.next_step};")
    assert todo_links.clauses('a: b(c, d); "e; f", g') == ["a", "b(c, d)", '"e; f"', "g"]


def test_explain_answers_from_the_installed_package(tmp_path):
    done = _run(["--explain", "_get_expert_parallel_group", "--explain", "groups"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "next step: use <mesh>.expert_groups(N).ep_group" in done.stdout and "groups (groups getter)" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 100
    done = _run(["--explain", "no_such_api"], tmp_path)
    assert done.returncode == 1 and "give a kind" in done.stdout


def _run(args, cwd, argv0=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CODEMODS_CACHE_DIR": str(cwd / ".cache")}
    code = "import sys; from codemods.migrate import main; sys.exit(main())"
    if argv0 is not None:  # as the console script: sys.argv[0] is its path
        code = f"import sys; sys.argv[0] = {argv0!r}; " + code
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_run_lists_each_todo_it_wrote_as_file_line(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    done = _run(["train.py", "--no-progress"], tmp_path)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "train.py").read_text().splitlines()
    listed = re.findall(r"^train\.py:(\d+): TODOV1: (.*) \(see ds-migrate --explain (\S+)\)$", done.stderr, re.M)
    todo_lines = [n for n, line in enumerate(written, 1) if "# TODOV1:" in line]
    assert [int(n) for n, _, _ in listed] == todo_lines and len(todo_lines) == 4
    for n, advice, code in listed:
        comment, after = written[int(n) - 1], int(n)
        while after < len(written) and written[after].lstrip().startswith("#   "):  # wrapped (todo_wrap)
            comment, after = comment + " " + written[after].lstrip()[4:], after + 1
        body = comment.split("# TODOV1: ")[1].rsplit("; ds-migrate --explain ", 1)[0]
        assert comment.endswith(f"--explain {code}") and (body.split(" (+")[0] in advice or ds_mesh_advice.find(code))
    assert "mesh_core.pipeline_topology(pp=pp, tp=mp, dp=world // (pp * mp))" in done.stderr  # the full advice


def test_diff_json_puts_json_alone_on_stdout(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    done = _run(["train.py", "--diff", "--json", "--no-progress"], tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert out["files_changed"] == 1 and "+from mesh_core import" in out["diffs"]["train.py"]
    assert [t["line"] for t in out["todos"]] and all(t["path"] == "train.py" and t["advice"] for t in out["todos"])
    assert (tmp_path / "train.py").read_text() == LEGACY  # --diff writes nothing


@pytest.mark.parametrize(
    "argv0, prog",
    [("/venv/bin/ds-migrate", "ds-migrate"), (str(REPO / "codemods" / "migrate.py"), "python -m codemods.migrate")],
)
def test_help_names_the_command_typed_and_has_no_markup(tmp_path, argv0, prog):
    done = _run(["--help"], tmp_path, argv0=argv0)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: {prog} "), done.stdout[:200]
    assert "``" not in done.stdout and ":class:" not in done.stdout and ":func:" not in done.stdout


def test_every_comm_todo_names_what_to_write():
    from codemods.rules.comm_to_torch import BACKEND, DIFFERENT, KILL_SWITCH

    names = sorted({**KILL_SWITCH, **BACKEND, **DIFFERENT})
    source = (
        "import deepspeed.comm as dist\ndef f(t, g, a, b):\n"
        + "".join(f"    dist.{n}(a, b)\n" for n in names)
        + "    dist.all_reduce(t, op=g)\n    dist.all_reduce(t, prof=True)\n    dist.all_reduce(*a)\n"
    )
    comments = _todo_comments(migrate_code(source, comm_to_torch=True).code)
    assert len(comments) == len(names) + 3 and len(set(comments)) == len(comments)  # one per site, each its own
    for comment in comments:
        body = re.fullmatch(r"# TODOV1: (.*); ds-migrate --explain comm", comment).group(1)
        assert len(comment) <= todo_links.MAX_COMMENT and todo_links.has_next_step(body), comment
        assert re.search(r"\w\.\w|\(", body), comment


def test_todo_comments_keep_lines_within_100_characters_and_a_long_lines_comment_stands_above():
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "codemods"
    written = 0
    for path in sorted(fixtures.rglob("*.py")):
        if path.name.endswith(".expected.py"):
            continue
        source = path.read_text()
        try:
            code = migrate_code(source).code
        except Exception:  # fixtures of failures are checked elsewhere
            continue
        for line in set(code.splitlines()) - set(source.splitlines()):
            if "# TODOV1:" in line or line.lstrip().startswith("#   "):
                written += "# TODOV1:" in line
                assert len(line) <= todo_links.MAX_COMMENT, (path.name, line)  # the indentation included
    assert written > 20
    source = "import deepspeed\n\ndef f(mpu):\n    value = mpu.get_data_parallel_rank(1)  # mine\n"
    done = migrate_code(source, module="deepspeed.runtime.x", package="deepspeed.runtime")
    lines = done.code.splitlines()
    # the comment's text is 100 characters: with the statement's indentation it takes two lines
    assert lines[3].startswith("    # TODOV1: ") and lines[4].startswith("    #   ")
    assert lines[5] == "    value = mpu.get_data_parallel_rank(1)  # mine"
    assert all(len(line) <= todo_links.MAX_COMMENT for line in lines)
    assert lines[4].endswith("; ds-migrate --explain mpu-internal") or lines[4].endswith(
        "#   ds-migrate --explain mpu-internal"
    )
    assert _todo_comments(done.code) == list(done.advice) and len(list(done.advice)[0]) > 96  # one comment, joined
    assert migrate_code(done.code, module="deepspeed.runtime.x", package="deepspeed.runtime").code == done.code
