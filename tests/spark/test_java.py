"""Where Java is missing, the tests that start Spark (the `spark` fixture) skip with that
reason; the others (options, columns, the reader and publisher against Hare) still run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spark.conftest import java_found


def test_java_is_found_through_java_home_or_path(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not java_found()
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert java_found()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(java.parent))
    assert java_found()

