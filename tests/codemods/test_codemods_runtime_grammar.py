"""The runtime decision (``compat.install()`` or not) is read from libcst's tree, never from the
running interpreter's parser: a legacy getter inside an f-string next to
``deepspeed.initialize(mpu=mpu)`` gets the runtime on Python 3.10, 3.11 and 3.12+ alike (the
rewrite's intermediate code puts quotes inside the f-string that only 3.12 reads). CI runs this
file on the oldest supported Python too (.ci/run)."""

from __future__ import annotations

import pytest

from codemods import migrate_code
from codemods._engine import runtime

FSTRING = """import deepspeed


def main(model, mpu, config):
    print(f"tp={mpu.get_model_parallel_world_size()} dp={mpu.get_data_parallel_world_size()}")
    engine, _, _, _ = deepspeed.initialize(model=model, mpu=mpu, config=config)
    return engine
"""
# the same with the getter's result bound first: no quotes inside an f-string (a control)
PLAIN = FSTRING.replace(
    '    print(f"tp={mpu.get_model_parallel_world_size()} dp={mpu.get_data_parallel_world_size()}")\n',
    "    tp = mpu.get_model_parallel_world_size()\n",
)


class _OlderGrammar:
    """``ast`` as Python 3.10/3.11 answers for code with quotes nested in an f-string: refused."""

    @staticmethod
    def parse(text, *args, **kwargs):
        raise SyntaxError("f-string: unmatched '('")

    def __getattr__(self, name):
        raise AssertionError(f"the runtime decision read ast.{name}")


@pytest.mark.parametrize("source", [FSTRING, PLAIN], ids=["fstring", "plain"])
def test_the_runtime_is_installed_whatever_the_interpreter_parses(source, monkeypatch):
    here = migrate_code(source)
    monkeypatch.setattr(runtime, "ast", _OlderGrammar())
    older = migrate_code(source)
    for m in (here, older):
        assert m.sites["initialize mpu"] == 1
        assert m.code.count("compat.install()") == 1, m.code
        assert m.code.index("compat.install()") < m.code.index("import deepspeed")
        compile(m.code, "train.py", "exec")  # quotes made portable: this interpreter reads it
    assert older.code == here.code


def test_needs_runtime_reads_libcst_trees_and_text():
    m = migrate_code(FSTRING)
    without = m.code.replace("import compat\n", "").replace(
        'compat.install()  # the mesh runtime: deepspeed.initialize reads the config\'s "mesh" section\n', ""
    )
    assert "compat" not in without
    assert runtime.needs_runtime(FSTRING, without, m.sites)
    assert not runtime.needs_runtime(FSTRING, m.code, m.sites)  # installs already
    # a comment naming compat.install() installs nothing
    assert runtime.needs_runtime(FSTRING, without + "# compat.install()\n", m.sites)
