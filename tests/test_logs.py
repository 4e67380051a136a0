"""broker.logs: JSON lines and console output, level filtering, stdlib records, secrets."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime

import pytest
import structlog

from broker import logs
from broker.logs import configure_logging, get_logger

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from broker.logs import configure_logging, get_logger

    log = get_logger("hare.test")  # module-level, before configuration, as modules do
    configure_logging(sys.argv[1], sys.argv[2])
    log.debug("debug_event")
    log.info("connection_opened", peer="127.0.0.1:5000", password="hunter2")
    log.warning("alarm_raised", resource="memory")
    logging.getLogger("asyncio").warning("stdlib %s", "record")
    logging.getLogger("asyncio").debug("stdlib debug")
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("failed")
    print("stdout stays clean")
    """
)


def run(level: str, fmt: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, level, fmt],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stdout stays clean\n"  # logs go to stderr only
    return done


def test_json_lines_have_event_level_timestamp() -> None:
    lines = [json.loads(line) for line in run("info", "json").stderr.splitlines()]
    assert [line["event"] for line in lines] == [
        "connection_opened",
        "alarm_raised",
        "stdlib record",
        "failed",
    ]
    for line in lines:
        assert {"event", "level", "timestamp", "logger"} <= set(line)
        stamp = datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
        assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0
    opened, alarm, stdlib, failed = lines
    assert opened["level"] == "info" and opened["logger"] == "hare.test"
    assert opened["peer"] == "127.0.0.1:5000"
    assert opened["password"] == "***"
    assert alarm["level"] == "warning" and alarm["resource"] == "memory"
    assert stdlib["logger"] == "asyncio" and stdlib["level"] == "warning"
    assert failed["level"] == "error" and "ZeroDivisionError" in failed["exception"]


def test_level_filters_structlog_and_stdlib() -> None:
    events = [json.loads(line)["event"] for line in run("debug", "json").stderr.splitlines()]
    assert "debug_event" in events and "stdlib debug" in events
    events = [json.loads(line)["event"] for line in run("warning", "json").stderr.splitlines()]
    assert events == ["alarm_raised", "stdlib record", "failed"]


def test_console_is_human_readable_and_auto_is_json_off_a_terminal() -> None:
    console = run("info", "console").stderr
    assert "connection_opened" in console and "peer=127.0.0.1:5000" in console
    assert "hunter2" not in console
    assert "Traceback" in console and not console.lstrip().startswith("{")
    # stderr is a pipe here, so "auto" picks JSON.
    auto = run("info", "auto").stderr.splitlines()
    assert json.loads(auto[0])["event"] == "connection_opened"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """In-process tests must leave the global logging set-up as they found it."""
    root = logging.getLogger()
    saved = (structlog.get_config(), root.handlers[:], root.level, logs._handler)
    yield
    config, handlers, level, handler = saved
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._handler = handler
    logging.captureWarnings(False)


@pytest.mark.usefixtures("restore_logging")
def test_reconfiguring_keeps_other_handlers_and_one_output() -> None:
    other = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(other)
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", stream=first)
    configure_logging("info", "json", stream=second)
    get_logger("hare.test").info("once")
    assert first.getvalue() == ""
    assert other in logging.getLogger().handlers
    assert [json.loads(line)["event"] for line in second.getvalue().splitlines()] == ["once"]


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(("level", "fmt"), [("loud", "json"), ("info", "xml")])
def test_bad_arguments_raise(level: str, fmt: str) -> None:
    with pytest.raises(ValueError):
        configure_logging(level, fmt, stream=io.StringIO())
