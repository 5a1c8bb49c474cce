"""The ``python -m codemods.migrate`` command line: modes, filters, errors, parallel runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from codemods import migrate as cli
from codemods import migrate_code
from codemods._engine.files import discover, module_and_package

REPO = Path(__file__).resolve().parent.parent.parent
LEGACY = "from deepspeed.utils import groups\n\nx = groups.get_data_parallel_group()  # keep\n"
MIGRATED = 'from mesh_core import current_mesh\n\nx = current_mesh().get_group("dp")  # keep\n'


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(LEGACY)
    (tmp_path / "pkg" / "clean.py").write_text("import os\n")
    (tmp_path / "pkg" / "broken.py").write_text("def f(:\n    groups.get_data_parallel_group()\n")
    (tmp_path / "pkg" / "sub").mkdir()
    (tmp_path / "pkg" / "sub" / "more.py").write_text(LEGACY.replace("x =", "y ="))
    return tmp_path


def test_rewrites_in_place_reports_errors_and_summary(tree, capsys):
    mode = (tree / "pkg" / "train.py").stat().st_mode
    os.chmod(tree / "pkg" / "train.py", mode | stat.S_IXUSR)
    rc = cli.main([str(tree), "--json", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 2  # one file does not parse
    assert (tree / "pkg" / "train.py").read_text() == MIGRATED
    assert (tree / "pkg" / "train.py").stat().st_mode & stat.S_IXUSR  # mode kept by the atomic write
    assert (tree / "pkg" / "broken.py").read_text().startswith("def f(:")  # untouched
    assert "error: " in err and "broken.py" in err and "cannot parse" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["files_scanned"] == 5 and summary["files_changed"] == 2 and summary["parse_errors"] == 1
    assert summary["sites_rewritten"] == {"groups getter": 2}
    assert "sites left with TODOV1: none" in err
    assert not list(tree.rglob("*.migrate"))  # no temporary files left behind


def test_diff_writes_nothing(tree, capsys):
    rc = cli.main([str(tree / "pkg" / "train.py"), "--diff"])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert (tree / "pkg" / "train.py").read_text() == LEGACY
    assert "-x = groups.get_data_parallel_group()  # keep" in out
    assert '+x = current_mesh().get_group("dp")  # keep' in out


def test_check_exit_status(tree):
    train = str(tree / "pkg" / "train.py")
    assert cli.main([train, "--check"]) == 1
    assert (tree / "pkg" / "train.py").read_text() == LEGACY
    assert cli.main([train]) == 0
    assert cli.main([train, "--check"]) == 0  # idempotent


def test_include_exclude(tree):
    names = lambda paths: sorted(p.name for p in paths)  # noqa: E731
    assert names(discover([tree], include=["sub/*"])) == ["more.py"]
    assert names(discover([tree], exclude=["broken.py", "sub/*"])) == ["__init__.py", "clean.py", "train.py"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        discover([tree / "missing"])


def test_module_names_come_from_packages(tree):
    assert module_and_package(tree / "pkg" / "sub" / "more.py") == ("more", "")  # sub/ is no package
    (tree / "pkg" / "sub" / "__init__.py").write_text("")
    assert module_and_package(tree / "pkg" / "sub" / "more.py") == ("pkg.sub.more", "pkg.sub")
    assert module_and_package(tree / "pkg" / "__init__.py") == ("pkg", "pkg")


def test_bad_jobs_is_rejected(tree, capsys):
    with pytest.raises(SystemExit):
        cli.main([str(tree), "--jobs", "0"])
    assert "--jobs 0 is not valid" in capsys.readouterr().err


def test_parallel_run_as_a_module(tree):
    (tree / "pkg" / "broken.py").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "codemods.migrate", "--jobs", "2", "--json", str(tree)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["files_changed"] == 2
    assert (tree / "pkg" / "sub" / "more.py").read_text() == MIGRATED.replace("x =", "y =")


def test_a_symlinked_file_stays_a_link_and_its_target_is_migrated(tree, tmp_path):
    target = tmp_path / "real.py"
    target.write_text(LEGACY)
    link = tree / "pkg" / "linked.py"
    link.symlink_to(target)
    assert cli.main([str(link), "--no-progress"]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == MIGRATED


def test_a_file_that_cannot_be_written_is_reported_and_the_run_goes_on(tree, capsys, monkeypatch):
    from codemods._engine import runner

    real = runner.write_atomically

    def refuse_train(path, text, **kwargs):
        if path.name == "train.py":
            raise PermissionError(13, "Permission denied", str(path))
        real(path, text, **kwargs)

    monkeypatch.setattr(runner, "write_atomically", refuse_train)
    (tree / "pkg" / "broken.py").unlink()
    rc = cli.main([str(tree), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "train.py: cannot write: " in err and "Permission denied" in err
    assert (tree / "pkg" / "train.py").read_text() == LEGACY
    assert (tree / "pkg" / "sub" / "more.py").read_text() == MIGRATED.replace("x =", "y =")


def test_diff_of_files_without_a_final_newline_applies_with_git(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("one.py").write_text(LEGACY.rstrip("\n"))  # no newline at the end
    Path("two.py").write_text(LEGACY)
    Path("three.py").write_text("# page one\n\x0c\n# page two\x0c\n" + LEGACY)  # form feeds are no line ends
    three = migrate_code(Path("three.py").read_text()).code
    assert cli.main(["one.py", "two.py", "three.py", "--diff"]) == 0
    patch = capsys.readouterr().out
    assert "\\ No newline at end of file\n" in patch
    done = subprocess.run(["git", "apply", "-"], input=patch, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path("one.py").read_text() == MIGRATED.rstrip("\n") and Path("two.py").read_text() == MIGRATED
    assert Path("three.py").read_text() == three


def test_a_pattern_naming_a_directory_covers_the_files_under_it(tree):
    names = lambda paths: sorted(p.name for p in paths)  # noqa: E731
    assert names(discover([tree], exclude=["sub"])) == ["__init__.py", "broken.py", "clean.py", "train.py"]
    assert names(discover([tree], include=["su?"])) == ["more.py"]
    assert names(discover([tree / "pkg"], exclude=["pkg"])) == names(
        discover([tree / "pkg"])
    )  # the root itself is not matched
