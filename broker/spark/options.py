"""The options of Hare's three Spark data sources (the "amqp" source and sink, "hare-store"):
one parser, one rule, errors that name the option.

Spark hands options over as a case-insensitive map of strings. Each error names the option as
the user spells it in the docs (``maxMessagesPerBatch``), and an option a source does not take
is an error too, so a typo fails the query instead of running it with a default. The keys that
Spark itself adds to a source's options (a streaming write's ``checkpointLocation`` and
``queryName``) pass.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["MAX_PREFETCH", "OptionError", "SinkOptions", "SourceOptions", "StoreOptions",
           "StreamSourceOptions"]

# basic.qos prefetch-count is a 16-bit field.
MAX_PREFETCH = 65535

# Keys Spark puts among a data source's options itself (lower case, as Spark hands them over).
_SPARK_KEYS = frozenset({"checkpointlocation", "queryname"})


class OptionError(ValueError):
    """A missing, bad or unknown option of one of Hare's data sources; the message names it."""


class _Options:
    """The options given to `role` (e.g. "amqp source"), which takes the names in `takes`:
    refuses the others by name on construction, then reads and checks one option at a time."""

    def __init__(self, role: str, options: Mapping[str, str], takes: tuple[str, ...]) -> None:
        self.role = role
        self._values = {key.lower(): value for key, value in options.items()}
        known = {name.lower() for name in takes} | _SPARK_KEYS
        unknown = sorted(key for key in options if key.lower() not in known)
        if unknown:
            names = ", ".join(f"'{key}'" for key in unknown)
            raise OptionError(f"{role}: unknown option {names}; it takes {', '.join(takes)}")

    def error(self, message: str) -> OptionError:
        return OptionError(f"{self.role}: {message}")

    def text(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)

    def required(self, name: str, hint: str = "") -> str:
        value = (self._values.get(name.lower()) or "").strip()
        if not value:
            raise self.error(f"option '{name}' is required{hint}")
        return value

    def url(self) -> str:
        url = self.required("url", " (e.g. amqp://guest:guest@localhost:5672/)")
        if not url.startswith(("amqp://", "amqps://")):
            raise self.error(f"option 'url' must start with amqp:// or amqps://, got {url!r}")
        return url

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        raw = self._values.get(name.lower())
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise self.error(f"option '{name}' must be an integer, got {raw!r}") from None
        if not low <= value <= high:
            raise self.error(f"option '{name}' must be between {low} and {high}, got {value}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        raw = self._values.get(name.lower())
        if raw is None:
            return default
        value = raw.strip().lower()
        if value not in ("true", "false"):
            raise self.error(f"option '{name}' must be true or false, got {raw!r}")
        return value == "true"


@dataclass(frozen=True)
class SourceOptions:
    url: str
    queue: str
    # Spark's own cost per micro-batch (offset and commit logs, planning, a job) is a few hundred
    # ms whatever its size: 30,000 small messages make it a fraction of the batch's time.
    max_messages_per_batch: int = 30000
    prefetch: int = 60000
    poll_timeout_ms: int = 500

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = _Options("amqp source", options,
                        ("url", "queue", "maxMessagesPerBatch", "prefetch", "pollTimeoutMs"))
        url = opts.url()
        queue = opts.required("queue")
        batch = opts.integer("maxMessagesPerBatch", cls.max_messages_per_batch, 1,
                             MAX_PREFETCH // 2)
        # A batch stays unacked until Spark has committed it, and the next batch is read while
        # it runs: the channel must be allowed two batches in flight.
        prefetch = opts.integer("prefetch", min(2 * batch, MAX_PREFETCH), 1, MAX_PREFETCH)
        if prefetch < 2 * batch:
            raise opts.error(
                f"option 'prefetch' ({prefetch}) must be at least 2 x maxMessagesPerBatch "
                f"({2 * batch}): a batch's messages stay unacked until Spark commits it, "
                "while the next batch is being read")
        poll = opts.integer("pollTimeoutMs", cls.poll_timeout_ms, 0, 3_600_000)
        return cls(url, queue, batch, prefetch, poll)


@dataclass(frozen=True)
class StreamSourceOptions:
    url: str
    stream: str
    # "earliest", "latest", an offset, or a time (aware datetime)
    starting: str | int | datetime.datetime = "latest"
    max_offsets_per_trigger: int = 30000
    prefetch: int = 60000
    poll_timeout_ms: int = 500
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamSourceOptions:
        opts = _Options("amqp-stream source", options,
                        ("url", "stream", "startingOffsets", "maxOffsetsPerTrigger",
                         "prefetch", "pollTimeoutMs", "failOnDataLoss"))
        url = opts.url()
        stream = opts.required("stream")
        raw = (opts.text("startingOffsets") or "latest").strip()
        starting: str | int | datetime.datetime
        if raw.lower() in ("earliest", "latest"):
            starting = raw.lower()
        elif raw.lstrip("-").isdigit():
            starting = int(raw)
            if starting < 0:
                raise opts.error(f"option 'startingOffsets' must not be negative, got {raw!r}")
        else:
            try:
                starting = datetime.datetime.fromisoformat(raw)
            except ValueError:
                raise opts.error(
                    "option 'startingOffsets' must be earliest, latest, an offset or an ISO "
                    f"8601 time (2026-01-01T00:00:00Z), got {raw!r}") from None
            if starting.tzinfo is None:
                starting = starting.replace(tzinfo=datetime.UTC)
        batch = opts.integer("maxOffsetsPerTrigger", cls.max_offsets_per_trigger, 1, 1_000_000)
        # the consumer's credit: what waits in the driver at most (acks only give it back)
        prefetch = opts.integer("prefetch", min(2 * batch, MAX_PREFETCH), 1, MAX_PREFETCH)
        poll = opts.integer("pollTimeoutMs", cls.poll_timeout_ms, 0, 3_600_000)
        return cls(url, stream, starting, batch, prefetch, poll,
                   opts.boolean("failOnDataLoss", cls.fail_on_data_loss))


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
        opts = _Options("amqp sink", options, ("url", "exchange", "routingKey", "maxInFlight",
                                               "mandatory", "persistent"))
        return cls(
            url=opts.url(),
            exchange=opts.text("exchange"),
            routing_key=opts.text("routingKey") or "",
            max_in_flight=opts.integer("maxInFlight", cls.max_in_flight, 1, 1_000_000),
            mandatory=opts.boolean("mandatory", cls.mandatory),
            persistent=opts.boolean("persistent", cls.persistent),
        )


@dataclass(frozen=True)
class StoreOptions:
    data_dir: str
    allow_live: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StoreOptions:
        opts = _Options("hare-store", options, ("path", "allowLive"))
        return cls(opts.required("path", ': the data directory, .load("DATA_DIR")'),
                   opts.boolean("allowLive", cls.allow_live))
