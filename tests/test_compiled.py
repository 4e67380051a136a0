"""Which build of the hot modules runs (broker/compiled.py): CI names the one it means to test
in HARE_TEST_EXPECT_BUILD ("compiled" after `make compile`, "python" in `make test-workers` and
`make test-fallback`), so a compiled run that silently fell back to the sources, or the
reverse, fails here."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import subprocess
import sys

import pytest

from broker import compiled

EXT = importlib.machinery.EXTENSION_SUFFIXES[0]
EXPECTED = os.environ.get("HARE_TEST_EXPECT_BUILD")


def _files() -> dict[str, str]:
    return {m: str(importlib.import_module(m).__file__) for m in compiled.MODULES}


@pytest.mark.skipif(EXPECTED is None, reason="HARE_TEST_EXPECT_BUILD unset: no build was asked for")
def test_the_expected_build_is_loaded() -> None:
    files = _files()
    if EXPECTED == "compiled":
        assert not compiled.stale(), "sources edited after `make compile`"
        assert {m: f for m, f in files.items() if not f.endswith(EXT)} == {}
        assert compiled.loaded() == list(compiled.MODULES)
    else:
        assert EXPECTED == "python", f"HARE_TEST_EXPECT_BUILD={EXPECTED!r}: compiled or python"
        assert {m: f for m, f in files.items() if not f.endswith(".py")} == {}
        assert compiled.loaded() == []


@pytest.mark.skipif(not compiled.built(), reason="no build: `make compile` makes one")
def test_hare_pure_python_runs_the_sources_beside_a_build() -> None:
    """The switch `make test-workers` uses, in a fresh interpreter as the broker's own
    process gets it: every hot module from its .py, though the build is there."""
    code = (
        "import importlib, broker.compiled as c\n"
        "print(*[importlib.import_module(m).__file__ for m in c.MODULES], sep='\\n')\n"
    )
    env = {**os.environ, "HARE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert len(out) == len(compiled.MODULES)
    assert [f for f in out if not f.endswith(".py")] == []
