"""Logging: structlog for Hare's own events, stdlib logging (asyncio, aiohttp) through the same
renderer, one stream (stderr).

    configure_logging("info", "auto")   # once, at start-up, from Settings.log_level/log_format
    log = get_logger(__name__)
    log.info("connection_opened", peer="10.0.0.7:51234", vhost="/")

Events are nouns or past-tense phrases with key=value context; JSON lines carry `timestamp`
(ISO 8601, UTC), `level`, `logger` and `event`.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

__all__ = ["LEVELS", "configure_logging", "get_logger"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_SECRET_KEYS = frozenset({"password", "passwd", "pass", "default_pass", "password_hash"})

# The handler this module installed on the root logger, replaced on reconfiguration so that
# handlers others added (pytest's log capture) stay in place.
_handler: logging.Handler | None = None


def _redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    # A safety net: a password passed as context by mistake never reaches the log.
    for key in _SECRET_KEYS.intersection(event_dict):
        event_dict[key] = "***"
    return event_dict


def _resolve_format(fmt: str, stream: TextIO) -> str:
    fmt = fmt.lower()
    if fmt == "auto":
        isatty = getattr(stream, "isatty", None)
        return "console" if isatty is not None and isatty() else "json"
    if fmt not in ("console", "json"):
        raise ValueError(f"log format must be console, json or auto, got {fmt!r}")
    return fmt


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Set up structlog and stdlib logging to write `fmt` ("console", "json" or "auto") lines
    at `level` and above to `stream` (stderr by default). Safe to call again."""
    global _handler
    try:
        level_no = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}") from None
    stream = sys.stderr if stream is None else stream
    fmt = _resolve_format(fmt, stream)

    # Applied to every event, structlog's and stdlib's alike.
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact_secrets,
    ]
    renderer: Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        final: list[Processor] = [structlog.processors.format_exc_info, renderer]
    else:
        isatty = getattr(stream, "isatty", None)
        renderer = structlog.dev.ConsoleRenderer(colors=bool(isatty and isatty()))
        final = [renderer]  # renders exc_info itself, readably

    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        # Drops calls below the level before any processor runs: debug calls cost ~nothing.
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        # Not cached: module-level loggers must follow a later configure_logging() call.
        cache_logger_on_first_use=False,
    )

    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
        )
    )
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(level_no)
    _handler = handler
    logging.captureWarnings(True)


def get_logger(name: str) -> FilteringBoundLogger:
    """A structlog logger named `name` (usually __name__).

    Safe at module level: it resolves the configuration on each call, so it follows a later
    configure_logging(). Bind context (`log.bind(conn=...)`) where it is used, not at import.
    """
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger
