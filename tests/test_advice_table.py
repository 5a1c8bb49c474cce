"""Replacement advice comes from one table (``ds_mesh_advice/replacements.json``): MIGRATION.md's
rows say what it says, the shim's warnings and the codemods' TODOV1 texts read it."""
from __future__ import annotations

import pathlib
import re

import ds_mesh_advice

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _migration_rows() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in (ROOT / "MIGRATION.md").read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `([^`]+)` \| (.*?) \|", line)
        if match:
            rows.setdefault(match.group(1), match.group(2))
    return rows


def test_migration_md_says_what_the_table_says():
    rows = _migration_rows()
    table = ds_mesh_advice.table()
    assert len(table) >= 50
    missing = sorted(set(table) - set(rows))
    assert not missing, f"rows missing from MIGRATION.md: {missing}"
    differ = {name: (rows[name], text) for name, text in table.items() if rows[name] != text}
    assert not differ, "MIGRATION.md's replacement differs from ds_mesh_advice/replacements.json: " + "; ".join(
        f"{name}: {got!r} != {want!r}" for name, (got, want) in sorted(differ.items()))


def test_the_shim_warns_with_the_tables_text():
    import compat.groups  # noqa: F401 (registers its legacy entries)
    from compat import deprecation

    checked = 0
    for name, text in ds_mesh_advice.table().items():
        entry = deprecation._ENTRIES.get(name)
        if entry is not None:
            assert entry.replacement == ds_mesh_advice.plain(name), name
            checked += 1
    assert checked >= 50
    # the advice that had drifted: the shim said mesh.size(('pp', 'tp')) whatever the mpu
    entry = deprecation._ENTRIES["deepspeed.utils.groups._get_model_parallel_world_size"]
    assert "for AutoTP" in entry.text and "1 without an mpu" in entry.text


def test_the_codemods_todo_texts_read_the_table():
    from codemods import groups_getters

    checked = 0
    for short, text in groups_getters.MANUAL.items():
        name = "deepspeed.utils.groups." + short
        if name in ds_mesh_advice.table():
            assert text == "use " + ds_mesh_advice.plain(name), short
            checked += 1
    assert checked >= 15
    assert groups_getters.MANUAL["_get_model_parallel_world_size"].startswith("use what the mpu gives")


def test_plain_text_has_no_markdown_and_unknown_names_say_where_to_add_them():
    assert "`" not in ds_mesh_advice.plain("deepspeed.utils.groups._get_data_parallel_group")
    try:
        ds_mesh_advice.replacement("deepspeed.utils.groups.no_such_api")
    except KeyError as err:
        assert "replacements.json" in str(err)
    else:
        raise AssertionError("an unknown name must raise")
