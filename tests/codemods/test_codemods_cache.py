"""The fixed-point cache: files a migration produced (or left alone) are skipped by ``--check`` and
reruns; anything else is migrated as usual."""

from __future__ import annotations

from codemods._engine.cache import FixedPoints
from codemods._engine.runner import run

LEGACY = "from deepspeed.utils import groups\nx = groups.get_data_parallel_group()\n"


def test_check_after_migration_skips_migrated_files_and_catches_new_legacy_code(tmp_path):
    cache_dir = tmp_path / "cache"
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "a.py").write_text(LEGACY)
    (tree / "b.py").write_text("print('no legacy here')\n")
    (tree / "c.py").write_text("from deepspeed.utils import groups\ny = groups._get_expert_parallel_group(name)\n")
    paths = sorted(tree.glob("*.py"))
    first = run(paths, cache=FixedPoints(directory=cache_dir))
    assert first.changed == 2 and first.todos  # a.py rewritten, c.py flagged
    check = run(paths, write=False, cache=FixedPoints(directory=cache_dir))
    assert check.changed == 0
    assert all(r.cached for r in check.reports)
    assert check.todos == first.todos  # the TODOV1 sites are still reported
    (tree / "b.py").write_text(LEGACY)  # new legacy code is not in the cache
    again = run(paths, write=False, cache=FixedPoints(directory=cache_dir))
    assert again.changed == 1 and [r.cached for r in again.reports] == [True, False, True]


def test_other_options_do_not_share_the_cache(tmp_path):
    assert FixedPoints(False, tmp_path).path != FixedPoints(True, tmp_path).path


# --- the key includes where the file lives -------------------------------------------------------
RELATIVE = "from . import groups\nx = groups._get_data_parallel_world_size()\n"
ABSOLUTE = "from deepspeed.utils import groups\nx = groups._get_data_parallel_world_size()\n"
PLACES = {  # directory -> the package path a file sits in ("" = no package)
    "user": "pkg",
    "deepspeed_utils": "deepspeed/utils",
    "loose": "",
}


def _place(root, place: str, name: str, text: str):
    directory = root / place
    directory.mkdir(parents=True, exist_ok=True)
    parts = PLACES[place].split("/") if PLACES[place] else []
    for i in range(len(parts)):
        package = directory.joinpath(*parts[: i + 1])
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    path = directory.joinpath(*parts, name)
    path.write_text(text)
    return path


def _answer(summary):
    return [(r.changed, dict(r.todos), dict(r.sites)) for r in summary.reports]


import pytest  # noqa: E402


@pytest.mark.parametrize("text", [RELATIVE, ABSOLUTE], ids=["relative", "absolute"])
@pytest.mark.parametrize("name", ["mod.py", "groups.py"])  # deepspeed/utils/groups.py defines the legacy API
@pytest.mark.parametrize("first", sorted(PLACES))
def test_same_bytes_in_two_places_get_each_places_own_answer(tmp_path, text, name, first):
    cache_dir = tmp_path / "cache"
    paths = {place: _place(tmp_path, place, name, text) for place in PLACES}
    order = [first] + [p for p in sorted(PLACES) if p != first]
    expected = {p: _answer(run([paths[p]], write=False, cache=None)) for p in order}
    if (text, name) in ((RELATIVE, "mod.py"), (ABSOLUTE, "groups.py")):  # these places do differ
        assert expected["user"] != expected["deepspeed_utils"], expected
    for place in order:  # each --check after the others filled the cache
        got = _answer(run([paths[place]], write=False, cache=FixedPoints(directory=cache_dir)))
        assert got == expected[place], place
    for place in order:  # a second round: everything cached, the same answers
        got = run([paths[place]], write=False, cache=FixedPoints(directory=cache_dir))
        assert _answer(got) == expected[place], place


# --- PEP 263 encodings ---------------------------------------------------------------------------
LATIN1 = (
    "# -*- coding: latin-1 -*-\n"
    "# caf\u00e9 \u00b5\n"
    "from deepspeed.utils import groups\n"
    "NAME = 'gar\u00e7on'\n"
    "x = groups._get_data_parallel_world_size()\n"
)


def test_a_latin1_file_is_migrated_and_written_back_in_latin1(tmp_path):
    from codemods import migrate as cli

    path = tmp_path / "legacy_latin1.py"
    path.write_bytes(LATIN1.encode("latin-1"))
    assert cli.main([str(path), "--check", "--no-cache", "--no-progress"]) == 1
    assert cli.main([str(path), "--no-cache", "--no-progress"]) == 0
    data = path.read_bytes()
    text = data.decode("latin-1")
    assert 'current_mesh().size("dp")' in text and "groups" not in text
    for line in LATIN1.splitlines(keepends=True):
        if "groups" not in line:
            assert line.encode("latin-1") in data  # every other line byte for byte, in latin-1
    compile(data, str(path), "exec")  # Python reads it through its coding line
    assert cli.main([str(path), "--check", "--no-cache", "--no-progress"]) == 0
