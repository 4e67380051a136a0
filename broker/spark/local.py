"""A small local SparkSession for examples, benchmarks and tests, with Hare's sources registered.

Spark starts its Python workers with the interpreter named by PYSPARK_PYTHON (default
``python3``); in a virtualenv that is not the one that has ``broker`` installed, and the
workers fail to import it. We name the interpreter running this code unless the user already
chose one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from broker.spark import register

__all__ = ["local_session"]


def local_session(app: str, scratch: Path | None = None, cores: int = 2,
                  driver_memory: str = "512m") -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "10s")
    )
    if scratch is not None:
        builder = (builder.config("spark.local.dir", str(scratch / "local"))
                   .config("spark.sql.warehouse.dir", str(scratch / "warehouse")))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
