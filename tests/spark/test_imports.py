"""The broker runs without Spark: no module outside broker/spark imports pyspark."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import importlib, pkgutil, sys
import broker
for info in pkgutil.walk_packages(broker.__path__, "broker."):
    # the mypyc build's shared library is no module of the sources (HARE_PURE_PYTHON hides it)
    if info.name.startswith(("broker.spark", "broker._compiled__mypyc")) \
            or info.name.endswith("__main__"):
        continue
    importlib.import_module(info.name)
heavy = sorted(m for m in ("pyspark", "pyarrow", "pandas", "py4j") if m in sys.modules)
print(",".join(heavy))
"""


def test_broker_modules_do_not_import_spark() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_register_is_importable_without_starting_spark() -> None:
    probe = "import sys, broker.spark; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "False"
