"""The options of the "amqp" source and sink: parsed once, checked, named in every error.

Spark hands options over as a case-insensitive map of strings; each error names the option as
the user spells it (``maxMessagesPerBatch``), so a typo is found without reading code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["MAX_PREFETCH", "OptionError", "SinkOptions", "SourceOptions"]

# basic.qos prefetch-count is a 16-bit field.
MAX_PREFETCH = 65535


class OptionError(ValueError):
    """A missing or bad option of the "amqp" data source; the message names the option."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in options.items()}


def _url(opts: dict[str, str], role: str) -> str:
    url = opts.get("url", "").strip()
    if not url:
        raise OptionError(f"amqp {role}: option 'url' is required "
                          "(e.g. amqp://guest:guest@localhost:5672/)")
    if not url.startswith(("amqp://", "amqps://")):
        raise OptionError(f"amqp {role}: option 'url' must start with amqp:// or amqps://, "
                          f"got {url!r}")
    return url


def _int(opts: dict[str, str], name: str, default: int, low: int, high: int, role: str) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"amqp {role}: option '{name}' must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise OptionError(f"amqp {role}: option '{name}' must be between {low} and {high}, "
                          f"got {value}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool, role: str) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"amqp {role}: option '{name}' must be true or false, got {raw!r}")


@dataclass(frozen=True)
class SourceOptions:
    url: str
    queue: str
    max_messages_per_batch: int = 10000
    prefetch: int = 20000
    poll_timeout_ms: int = 500

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = _lower(options)
        url = _url(opts, "source")
        queue = opts.get("queue", "")
        if not queue:
            raise OptionError("amqp source: option 'queue' is required")
        batch = _int(opts, "maxMessagesPerBatch", cls.max_messages_per_batch, 1,
                     MAX_PREFETCH // 2, "source")
        # A batch stays unacked until Spark has committed it, and the next batch is read while
        # it runs: the channel must be allowed two batches in flight.
        prefetch = _int(opts, "prefetch", min(2 * batch, MAX_PREFETCH), 1, MAX_PREFETCH, "source")
        if prefetch < 2 * batch:
            raise OptionError(
                f"amqp source: option 'prefetch' ({prefetch}) must be at least 2 x "
                f"maxMessagesPerBatch ({2 * batch}): a batch's messages stay unacked until "
                "Spark commits it, while the next batch is being read")
        poll = _int(opts, "pollTimeoutMs", cls.poll_timeout_ms, 0, 3_600_000, "source")
        return cls(url, queue, batch, prefetch, poll)


@dataclass(frozen=True)
class SinkOptions:
    url: str
    exchange: str | None = None
    routing_key: str = ""
    max_in_flight: int = 1000
    mandatory: bool = True
    persistent: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = _lower(options)
        return cls(
            url=_url(opts, "sink"),
            exchange=opts.get("exchange"),
            routing_key=opts.get("routingkey", ""),
            max_in_flight=_int(opts, "maxInFlight", cls.max_in_flight, 1, 1_000_000, "sink"),
            mandatory=_bool(opts, "mandatory", cls.mandatory, "sink"),
            persistent=_bool(opts, "persistent", cls.persistent, "sink"),
        )
