"""Node's amqplib against Hare: confirms, a mandatory return, consume and ack."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "node"


def test_amqplib_roundtrip(broker):
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    if not (HERE / "node_modules" / "amqplib").is_dir():
        pytest.skip("amqplib is not installed (cd tests/clients/node && npm install)")
    r = subprocess.run(["node", "roundtrip.js", broker.url], cwd=HERE, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["got"] == [f"m{i}" for i in range(10)]
    assert out["returned"] == 312
