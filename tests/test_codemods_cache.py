"""The fixed-point cache: files a migration produced (or left alone) are skipped by ``--check`` and
reruns; anything else is migrated as usual."""
from __future__ import annotations

from codemods.cache import FixedPoints
from codemods.runner import run

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
