"""Byte preservation: a migration changes the bytes of the rewritten sites only. Random unrelated
code around the sites (f-strings of every quoting, comments, non-ASCII text, blank lines) comes out
byte for byte, and the rest of the output is what the sites alone migrate to."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codemods import migrate_code
from codemods._engine.portable import parse_error

HEADER = "from deepspeed.utils import groups\nd = {'a': 1, \"b\": 2}\nw = 4\n"
SITES = (
    "groups._get_data_parallel_world_size()",
    "groups._get_sequence_parallel_group()",
    "groups.get_data_parallel_rank()",
    "groups._get_data_parallel_group()",
)
# expressions valid on Python 3.10: every quoting, prefixes, nesting, conversions, format specs
FSTRINGS = (
    "f\"{d['a']}\"",
    "f'{d[\"b\"]}'",
    'f"""{d["a"]}"""',
    "f'''{d['a']}'''",
    'f"""{d[\'b\']} "q" """',
    "rf\"\\d{d['a']}\"",
    "Fr'{d[\"a\"]}\\n'",
    "f\"{f'{w}'}\"",
    "f'{w!r:>{w}}'",
    'f"{{literal}} {w}"',
    "f\"é {'中'} {w:#x}\"",
    "f'''{\"\"\"x\"\"\"}'''",
    'f"{w}" "plain" f\'{d["a"]}\'',
    "f\"{d['a'] if w else 'x'}\"",
)
COMMENTS = ("# a comment", "# 'quoted' \"both\"", "#no space", "# é 中 ☃", "#   f\"{d['a']}\" in a comment")


def _unrelated(i: int):
    fstring = st.sampled_from(FSTRINGS)
    return st.one_of(
        fstring.map(lambda f: f"u{i} = {f}\n"),
        st.tuples(fstring, st.sampled_from(COMMENTS)).map(lambda t: f"u{i} = {t[0]}  {t[1]} {i}\n"),
        st.sampled_from(COMMENTS).map(lambda c: f"{c} {i}\n"),
        fstring.map(lambda f: f"def g{i}(x=w):\n    # inside {i}\n    return {f}\n\n"),
        st.just(f"\n\nu{i} = [\n    1,  # {i}\n    2,\n]\n"),
    )


@st.composite
def programs(draw):
    """(segments, placeholders): segments are ("u", unrelated text) or ("s", site text); a site may
    hold an unrelated f-string inline (its placeholder name stands for it in the sites-only source)."""
    segments: list[tuple[str, str]] = []
    inline: dict[str, str] = {}
    for i in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            segments.append(("u", draw(_unrelated(i))))
        site = draw(st.sampled_from(SITES))
        form = draw(st.sampled_from(["plain", "fstring", "beside", "function"]))
        if form == "plain":
            segments.append(("s", f"s{i} = {site}\n"))
        elif form == "fstring":
            segments.append(("s", f"s{i} = f\"{{{site}}} {{d['a']}}\"\n"))
        elif form == "function":
            segments.append(("s", f"def h{i}():\n    return {site}\n"))
        else:  # an unrelated f-string in the same statement as the site
            name = f"_inline{i}_"
            inline[name] = draw(st.sampled_from(FSTRINGS))
            segments += [("s", f"s{i} = ("), ("u", inline[name]), ("s", f", {site})\n")]
    return segments, inline


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs())
def test_unrelated_code_around_sites_is_kept_byte_for_byte(program):
    segments, inline = program
    source = HEADER + "".join(text for _, text in segments)
    assert parse_error(source) is None, source
    out = migrate_code(source).code
    assert out != source
    # every unrelated segment is in the output, verbatim and in order ...
    rest, position = [], 0
    for kind, text in segments:
        if kind != "u":
            continue
        found = out.find(text, position)
        assert found >= 0, f"unrelated code changed:\n{text}\n--- output:\n{out}"
        rest.append(out[position:found])
        position = found + len(text)
    rest.append(out[position:])
    # ... and what is around them is what the sites alone migrate to
    names = iter(inline)
    alone = HEADER + "".join(
        text if kind == "s" else next(names) if text in inline.values() and segments[k - 1][1].endswith("= (") else ""
        for k, (kind, text) in enumerate(segments)
    )
    expected = migrate_code(alone).code
    for name in inline:
        expected = expected.replace(name, "")
    assert "".join(rest) == expected


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(program=programs())
def test_a_pep263_file_keeps_its_encoding_and_every_unrelated_byte(program, tmp_path_factory):
    from hypothesis import assume

    from codemods._engine.runner import migrate_file

    segments, _ = program
    source = "# -*- coding: latin-1 -*-\n# caf\u00e9\n" + HEADER + "".join(text for _, text in segments)
    try:
        data = source.encode("latin-1")
    except UnicodeEncodeError:
        assume(False)
    path = tmp_path_factory.mktemp("latin1") / "legacy.py"
    path.write_bytes(data)
    report = migrate_file(str(path))
    assert report.error is None and report.changed, report.error
    out = path.read_bytes()
    expected = migrate_code(source).code.encode("latin-1")
    assert out == expected
    for kind, text in segments:
        if kind == "u":
            assert text.encode("latin-1") in out
