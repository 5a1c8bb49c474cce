"""A rule failing at one site never stops the file: that statement is left as it is and reported
(``file:line``, why), the rest of the file migrates, and ``ds-migrate`` exits 3 (2 is for files
that cannot be read, parsed or written)."""

from __future__ import annotations

import ast

import libcst as cst
import pytest

from codemods import migrate as cli
from codemods import migrate_code
from codemods._engine import metadata
from codemods._engine.todo_wrap import unwrap
from codemods.rules.groups_getters import GroupsGettersCommand
from codemods.rules.topology import TopologyCommand

# the multi-line pipeline topology call stored on self / returned: its TODOV1 quoted the call's
# line breaks (libcst refused the comment and the whole file was reported as unreadable)
MULTI_LINE = """from deepspeed.utils import groups
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology


class Model:
    def __init__(self, pp_size, dp_size):
        self.topo = PipeModelDataParallelTopology(
            num_pp=pp_size,  # stages
            num_mp=1,
            num_dp=dp_size,
        )
        self.ws = groups._get_data_parallel_world_size()


def make(pp_size, dp_size):
    return PipeModelDataParallelTopology(
        num_pp=pp_size, num_mp=1,
        num_dp=dp_size)
"""


@pytest.fixture(autouse=True)
def _fresh_hooks(monkeypatch):
    """The codemods' hooks are looked up once per class; a test that patches one needs a new table."""
    monkeypatch.setattr(metadata, "_HOOKS", {})


def _todo_lines(code: str) -> list[str]:
    """The TODOV1 comment lines of ``code`` (a comment wrapped to stay within 100 characters joined)."""
    return [line for line in unwrap(code).splitlines() if "# TODOV1:" in line]


def test_a_multi_line_topology_call_is_flagged_on_one_comment_line():
    m = migrate_code(MULTI_LINE)
    ast.parse(m.code)
    assert not m.failures
    assert m.todos["grid construction"] == 2 and m.sites["groups getter"] == 1
    for line in _todo_lines(m.code):
        assert line.rstrip().endswith("ds-migrate --explain grid"), line
    # the full advice quotes the call on one line, whole
    full = " ".join(a for advice in m.advice.values() for a in advice)
    assert "\n" not in full and "pipeline_topology(pp=pp_size, tp=1, dp=dp_size)" in full
    assert migrate_code(m.code).code == m.code


def test_a_rule_raising_at_one_site_leaves_that_statement_and_migrates_the_rest(monkeypatch):
    real = TopologyCommand.leave_Call

    def fails_on_make(self, original_node, updated_node):
        if "num_dp=dp_size)" in cst.Module([]).code_for_node(original_node):
            raise RuntimeError("boom at this site")
        return real(self, original_node, updated_node)

    monkeypatch.setattr(TopologyCommand, "leave_Call", fails_on_make)
    m = migrate_code(MULTI_LINE)
    assert [line for line, _ in m.failures] == [16]
    assert "TopologyCommand" in m.failures[0][1] and "boom at this site" in m.failures[0][1]
    assert m.code.endswith(MULTI_LINE[MULTI_LINE.index("def make") :])  # byte for byte, no comment
    assert m.sites["groups getter"] == 1 and m.todos["grid construction"] == 1  # the rest migrated


def test_a_rewrite_that_would_not_parse_is_refused_per_statement(monkeypatch):
    def broken(self, original_node, updated_node):
        if updated_node is not original_node:  # a rewritten statement: give it code that does not parse
            bad = cst.Assign(targets=[cst.AssignTarget(cst.Call(func=cst.Name("f")))], value=cst.Name("x"))
            return updated_node.with_changes(body=[bad])
        return updated_node

    monkeypatch.setattr(GroupsGettersCommand, "on_statement", broken, raising=False)
    m = migrate_code(MULTI_LINE)
    assert [line for line, _ in m.failures] == [12]
    assert "would not parse" in m.failures[0][1]
    assert "groups._get_data_parallel_world_size()" in m.code and "f() = x" not in m.code
    ast.parse(m.code)


def test_cli_reports_failed_sites_with_their_line_and_exits_3(tmp_path, monkeypatch, capsys):
    real = TopologyCommand.leave_Call

    def fails(self, original_node, updated_node):
        if "Topology" in cst.Module([]).code_for_node(original_node.func):
            raise ValueError("cannot do this one")
        return real(self, original_node, updated_node)

    monkeypatch.setattr(TopologyCommand, "leave_Call", fails)
    path = tmp_path / "model.py"
    path.write_text(MULTI_LINE)
    (tmp_path / "other.py").write_text("from deepspeed.utils import groups\nx = groups.get_data_parallel_group()\n")
    rc = cli.main([str(tmp_path), "--no-progress", "--no-cache"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_CODEMOD_FAILED == 3
    assert f"{path}:7: not migrated (statement left as it is): TopologyCommand: ValueError: cannot do this one" in err
    assert f"{path}:16: not migrated" in err
    assert 'current_mesh().get_group("dp")' in (tmp_path / "other.py").read_text()
    assert 'current_mesh().size("dp")' in path.read_text()  # the rest of the file migrated
    assert "not read/parsed/written: 0, codemod failures: 0 files, 2 sites" in err


def test_cli_exit_status_parse_error_is_2_and_wins(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "ok.py").write_text(MULTI_LINE)
    assert cli.main([str(tmp_path), "--no-progress", "--no-cache", "--check"]) == cli.EXIT_UNREADABLE == 2
    err = capsys.readouterr().err
    assert "broken.py: cannot parse" in err and "not read/parsed/written: 1, codemod failures: 0 files" in err


def test_a_codemod_failing_on_a_whole_file_is_not_called_a_parse_error(tmp_path, monkeypatch, capsys):
    def fails(self, original_node, updated_node):
        raise RuntimeError("module-level failure")

    monkeypatch.setattr(TopologyCommand, "leave_Module", fails)
    (tmp_path / "ok.py").write_text(MULTI_LINE)
    assert cli.main([str(tmp_path), "--no-progress", "--no-cache", "--json"]) == 3
    out, err = capsys.readouterr()
    assert "codemod failed (file left unchanged): RuntimeError: module-level failure" in err
    assert '"parse_errors": 0, "codemod_failures": 1' in out
    assert (tmp_path / "ok.py").read_text() == MULTI_LINE


def test_a_todo_comment_never_cuts_inside_a_quoted_call():
    from codemods._engine.todo_links import MAX_COMMENT, todo_comment

    call = "mesh_core.pipeline_topology(pp=pp_size, tp=1, dp=dp_size)"
    message = f"topology kept: {call} is the same topology (axes and answers, what PipelineModule needs)"
    written_across_lines = message.replace("(pp=pp_size, ", "(\n    pp=pp_size,  # stages\n    ")
    for entries in (
        [("pipeline topology", message)],
        [("pipeline topology", written_across_lines)],
        [("pipeline topology", message), ("pipeline topology", "pp=1 (+1) " + message)],
    ):
        text = todo_comment(entries)
        assert len(text) <= MAX_COMMENT and "\n" not in text and "…" not in text, text
        # the call is quoted whole or not at all, never cut inside its brackets
        assert text.count("(") == text.count(")") and "pp=pp_size;" not in text, text


def test_no_blank_line_is_added_after_the_added_imports():
    source = (
        "import deepspeed\nfrom deepspeed.utils import groups\nfrom helpers import log\n"
        "try:\n    import wandb\nexcept ImportError:\n    wandb = None\n\n"
        "def dp():\n    return groups._get_data_parallel_world_size()\n"
    )
    code = migrate_code(source).code
    assert "from mesh_core import current_mesh\ntry:\n" in code, code
