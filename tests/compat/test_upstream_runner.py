"""The upstream runner's own logic (tests/upstream/runner.py), without running DeepSpeed's tests:
reports, log parsing, the fp32 variants, the tree copy, the shim's start-up hook, the regression rule.
The runs themselves: ``python tools/run_upstream.py --subset fast`` (CI) / ``--subset full``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from upstream import runner


def test_parse_junit_outcomes(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase classname="unit.a.test_x.TestC" name="test_ok[1]" />
          <testcase classname="unit.a.test_x" name="test_fail"><failure message="boom"/></testcase>
          <testcase classname="unit.a.test_x" name="test_err"><error message="setup"/></testcase>
          <testcase classname="unit.a.test_x" name="test_skip"><skipped message="fp16"/></testcase>
        </testsuite></testsuites>""")
    )
    assert runner.parse_junit(xml) == {
        "unit.a.test_x.TestC::test_ok[1]": "passed",
        "unit.a.test_x::test_fail": "failed",
        "unit.a.test_x::test_err": "error",
        "unit.a.test_x::test_skip": "skipped",
    }


def test_parse_log_of_a_stopped_run(tmp_path):
    log = tmp_path / "legacy.log"
    log.write_text(
        "unit/a/test_x.py::TestC::test_ok[1-2] \x1b[32mPASSED\x1b[0m [  1%]\n"
        "[gw0] [  2%] unit/a/test_x.py::test_fail FAILED\n"
        "unit/a/test_x.py::test_skip SKIPPED (fp16 not supported)\n"
        "unit/a/test_x.py::test_cut_off\n"
    )
    assert runner.parse_log(log) == {
        "unit.a.test_x.TestC::test_ok[1-2]": "passed",
        "unit.a.test_x::test_fail": "failed",
        "unit.a.test_x::test_skip": "skipped",
    }
    assert runner.nodeid_to_junit("unit/a/test_x.py::TestC::test_ok[1-2]") == "unit.a.test_x.TestC::test_ok[1-2]"


def test_regression_rule_and_summary():
    legacy = {"a": "passed", "b": "passed", "c": "failed", "d": "skipped"}
    shim = {"a": "passed", "b": "failed", "c": "passed", "e": "passed"}
    rows = {r.test: r for r in runner.compare(legacy, shim)}
    assert [t for t, r in rows.items() if r.regression] == ["b"]
    assert rows["c"].fixed and not rows["c"].regression
    assert rows["d"].shim == "missing" and not rows["d"].regression
    assert rows["e"].legacy == "missing" and not rows["e"].regression
    summary = runner.summarize(list(rows.values()), 10.0, 12.0)
    assert (summary.tests, summary.pass_both, summary.regressions) == (5, 1, 1)
    table = runner.format_table(list(rows.values()), summary, markdown=True)
    assert "| `b` | passed | failed | REGRESSION |" in table
    assert "5 tests run; 1 pass both ways; 1 regressions" in table


def test_fp32_variant_source():
    source = textwrap.dedent("""\
        import torch
        config = {"fp16": {"enabled": True}, "bf16": {"enabled": True, "x": 1}}
        config_dict["fp16"] = {"enabled": True}
        model = model.half()
        dtype = preferred_dtype()
        x = torch.zeros(1, dtype=torch.bfloat16)
        """)
    out = runner.fp32_source(source)
    assert '"fp16": {"enabled": False}' in out and '"bf16": {"enabled": False, "x": 1}' in out
    assert 'config_dict["fp16"] = {"enabled": False}' in out
    assert ".float()" in out and "dtype = torch.float32" in out and "dtype=torch.float32" in out
    assert runner.fp32_source("import torch\nx = 1\n") is None


def test_prepare_tree_copies_patches_and_adds_variants(tmp_path):
    tree = tmp_path / "tests"
    (tree / "unit" / "checkpoint").mkdir(parents=True)
    (tree / "unit" / "test_a.py").write_text('import torch\nC = {"fp16": {"enabled": True}}\n')
    (tree / "unit" / "test_b.py").write_text("def test_b():\n    pass\n")
    (tree / "unit" / "checkpoint" / "common.py").write_text(
        "def f(saved_model, loaded_model):\n"
        "    assert saved_model.sparse_tensor_module_names == loaded_model.sparse_tensor_module_names\n"
    )
    work = tmp_path / "work"
    selected = runner.prepare_tree(tree, work, ["unit/test_a.py", "unit/test_b.py"], fp32=True)
    assert selected == ["unit/test_a.py", "unit/test_a_fp32.py", "unit/test_b.py"]
    assert '"enabled": False' in (work / "unit" / "test_a_fp32.py").read_text()
    assert "sparse_tensor_module_names" not in (work / "unit" / "checkpoint" / "common.py").read_text()
    only = runner.prepare_tree(tree, work, ["unit/test_a.py", "unit/test_b.py"], fp32=False, fp32_only=True)
    assert only == ["unit/test_a_fp32.py", "unit/test_b.py"]
    with pytest.raises(FileNotFoundError, match="test_missing.py"):
        runner.prepare_tree(tree, work, ["unit/test_missing.py"], fp32=False)


def test_run_env_installs_the_shim_only_in_shim_mode(tmp_path):
    legacy = runner.run_env("legacy", timeout=60)
    shim = runner.run_env("shim", timeout=60, probe=tmp_path / "probe")
    assert "DS_MESH" not in legacy and shim["DS_MESH"] == "1"
    assert str(runner.SITE_HOOK_DIR) not in legacy["PYTHONPATH"].split(os.pathsep)
    assert shim["PYTHONPATH"].split(os.pathsep)[0] == str(runner.SITE_HOOK_DIR)
    assert legacy["LOCAL_SIZE"] == "16" and int(legacy["DS_UNITTEST_TIMEOUT"]) > 60
    assert legacy["DS_MESH_UPSTREAM_PORT_BASE"] != shim["DS_MESH_UPSTREAM_PORT_BASE"]
    with pytest.raises(ValueError, match="mode 'x'"):
        runner.run_env("x", timeout=1)


def test_site_hook_installs_the_shim_in_a_fresh_interpreter(tmp_path):
    """What every test process of a shim run executes at start-up (sitecustomize via DS_MESH=1)."""
    env = runner.run_env("shim", timeout=60, probe=tmp_path / "probe")
    code = (
        "import compat.install as i, deepspeed.comm as c, compat.comm_routes as r;"
        "print(i.is_installed(), c.new_group is r.new_group)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["True", "True"]
    assert (tmp_path / "probe").read_text().strip() != ""
    plain = subprocess.run(
        [sys.executable, "-c", code],
        env=runner.run_env("legacy", timeout=60),
        capture_output=True,
        text=True,
        check=True,
    )
    assert plain.stdout.split()[-2:] == ["False", "False"]


def test_a_hung_test_is_found_and_later_rounds_are_merged(tmp_path):
    """A hang ends the pytest session; the runner finds the test it cut off and merges the rounds."""
    first = (
        "unit/a/test_x.py::TestA::test_one \x1b[32mPASSED\x1b[0m [ 50%]\n"
        "unit/a/test_x.py::TestA::test_two some output of the test\n"
        "more output\n"
        "INTERNALERROR> Failed: Timeout (>600.0s) from pytest-timeout.\n"
    )
    (tmp_path / "shim.log").write_text(first)
    finished, hung = runner.finished_and_hung(tmp_path / "shim.log")
    assert finished == ["unit/a/test_x.py::TestA::test_one"]
    assert hung == "unit/a/test_x.py::TestA::test_two"
    (tmp_path / "shim.r1.log").write_text("unit/a/test_x.py::test_three FAILED [100%]\n= 1 failed =\n")
    assert runner.finished_and_hung(tmp_path / "shim.r1.log") == (["unit/a/test_x.py::test_three"], None)
    assert runner.mode_outcomes(tmp_path, "shim") == {
        "unit.a.test_x.TestA::test_one": runner.PASSED,
        "unit.a.test_x.TestA::test_two": runner.HUNG,
        "unit.a.test_x::test_three": runner.FAILED,
    }
    # the last round of a stopped run: its in-flight test is not called hung
    (tmp_path / "shim.r1.log").unlink()
    assert runner.mode_outcomes(tmp_path, "shim") == {"unit.a.test_x.TestA::test_one": runner.PASSED}


def test_a_session_that_never_exits_after_its_summary_is_killed(tmp_path):
    """pytest can print its summary and then wait forever on a hung test's forked child."""
    import subprocess
    import sys

    log = tmp_path / "shim.log"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('child', child.pid, flush=True)\n"
        "print('==== 1 failed, 8 passed in 943.15s (0:15:43) ====', flush=True)\n"
        "time.sleep(600)\n"
    )
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        returncode = runner.wait_for_session(proc, log, grace=1)
    assert returncode != 0  # killed, not finished
    import time
    from pathlib import Path

    child_pid = int(log.read_text().split("child ")[1].split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a killed child may stay a zombie until its new parent reaps it
        try:
            state = Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the session's child process {child_pid} outlived it")


def test_an_alternate_deepspeed_location_goes_first_and_is_checked(tmp_path):
    copy = tmp_path / "copy" / "deepspeed"
    copy.mkdir(parents=True)
    (copy / "__init__.py").write_text("__version__ = 'copy'\n")
    probe = tmp_path / "ds.probe"
    env = runner.run_env("shim", timeout=60, deepspeed=copy, deepspeed_probe=probe, port_offset=6000)
    path = env["PYTHONPATH"].split(os.pathsep)
    assert path.index(str(copy.parent)) < path.index(str(runner.REPO))
    assert env["TORCH_EXTENSIONS_DIR"].startswith(str(copy.parent))  # its own JIT builds
    assert int(env["DS_MESH_UPSTREAM_PORT_BASE"]) == runner.PORT_BASES["shim"] + 6000 + int(
        os.environ.get("DS_MESH_UPSTREAM_PORT_OFFSET", "0")
    )
    # the plugin's probe, as a pytest process of the run records it
    code = "import sys; sys.path.insert(0, %r); import ds_mesh_upstream as p; p._record_deepspeed()" % str(
        runner.PLUGIN_DIR
    )
    subprocess.run([sys.executable, "-c", code], env=dict(env, DS_MESH=""), check=True, cwd=tmp_path)
    found = runner.imported_deepspeed(probe)
    assert found == [str(copy / "__init__.py")]
    runner.check_deepspeed(found, copy, tmp_path)
    with pytest.raises(RuntimeError, match="not from"):
        runner.check_deepspeed(["/elsewhere/deepspeed/__init__.py"], copy, tmp_path)
    with pytest.raises(RuntimeError, match="never recorded"):
        runner.check_deepspeed([], None, tmp_path)
    with pytest.raises(ValueError, match="not a deepspeed package directory"):
        runner.run_env("shim", timeout=60, deepspeed=tmp_path)
