"""Options of the "amqp" source and sink and of "hare-store": one rule for all three (an option
a source does not take is an error naming it; Spark's own keys pass), errors that name the
option, the defaults. No Spark session needed."""

from __future__ import annotations

import pytest

from broker.spark.options import OptionError, SinkOptions, SourceOptions, StoreOptions

URL = "amqp://guest:guest@127.0.0.1:5672/"


def test_source_defaults() -> None:
    opts = SourceOptions.parse({"url": URL, "queue": "q"})
    assert (opts.max_messages_per_batch, opts.prefetch, opts.poll_timeout_ms) == (30000, 60000, 500)
    # Spark hands the keys over in lower case
    opts = SourceOptions.parse({"url": URL, "queue": "q", "maxmessagesperbatch": "10"})
    assert opts.prefetch == 20


def test_sink_defaults() -> None:
    opts = SinkOptions.parse({"url": URL})
    assert (opts.exchange, opts.routing_key, opts.max_in_flight, opts.mandatory,
            opts.persistent) == (None, "", 1000, True, True)
    opts = SinkOptions.parse({"url": URL, "Mandatory": "FALSE", "persistent": "true"})
    assert (opts.mandatory, opts.persistent) == (False, True)


def test_store_defaults() -> None:
    assert StoreOptions.parse({"path": "/data"}) == StoreOptions("/data", False)
    assert StoreOptions.parse({"path": "/data", "allowlive": "true"}).allow_live


@pytest.mark.parametrize(("parse", "options", "named"), [
    (SourceOptions.parse, {"queue": "q"}, "amqp source: option 'url' is required"),
    (SourceOptions.parse, {"url": "http://x/", "queue": "q"}, "'url' must start with amqp://"),
    (SourceOptions.parse, {"url": URL}, "amqp source: option 'queue' is required"),
    (SourceOptions.parse, {"url": URL, "queue": "q", "maxMessagesPerBatch": "many"},
     "'maxMessagesPerBatch' must be an integer"),
    (SourceOptions.parse, {"url": URL, "queue": "q", "maxMessagesPerBatch": "0"},
     "'maxMessagesPerBatch' must be between 1 and 32767"),
    (SourceOptions.parse, {"url": URL, "queue": "q", "prefetch": "70000"}, "'prefetch'"),
    (SourceOptions.parse, {"url": URL, "queue": "q", "pollTimeoutMs": "-1"}, "'pollTimeoutMs'"),
    (SinkOptions.parse, {"exchange": "x"}, "amqp sink: option 'url' is required"),
    (SinkOptions.parse, {"url": URL, "maxInFlight": "0"}, "'maxInFlight'"),
    (SinkOptions.parse, {"url": URL, "mandatory": "perhaps"},
     "'mandatory' must be true or false, got 'perhaps'"),
    (SinkOptions.parse, {"url": URL, "persistent": "1"}, "'persistent' must be true or false"),
    (StoreOptions.parse, {}, "hare-store: option 'path' is required"),
    (StoreOptions.parse, {"path": "/d", "allowLive": "yes"}, "'allowLive' must be true or false"),
])
def test_bad_option_is_named(parse, options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse(options)


def test_prefetch_below_two_batches_is_refused() -> None:
    with pytest.raises(OptionError, match=r"'prefetch' \(150\) must be at least 2 x "
                                          r"maxMessagesPerBatch \(200\)"):
        SourceOptions.parse({"url": URL, "queue": "q", "maxMessagesPerBatch": "100",
                             "prefetch": "150"})


@pytest.mark.parametrize(("parse", "options", "message"), [
    (SourceOptions.parse, {"url": URL, "queue": "q", "prefech": "10"},
     "amqp source: unknown option 'prefech'; it takes url, queue, maxMessagesPerBatch, "
     "prefetch, pollTimeoutMs"),
    # load(PATH) on the amqp source: a path means nothing to it
    (SourceOptions.parse, {"url": URL, "queue": "q", "path": "events"},
     "amqp source: unknown option 'path'"),
    (SinkOptions.parse, {"url": URL, "routing_key": "k", "exchnage": "x"},
     "amqp sink: unknown option 'exchnage', 'routing_key'; it takes url, exchange, routingKey"),
    (StoreOptions.parse, {"path": "/d", "queue": "q"},
     "hare-store: unknown option 'queue'; it takes path, allowLive"),
])
def test_unknown_option_is_refused_by_name(parse, options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=f"^{message}"):
        parse(options)


def test_keys_spark_adds_itself_pass() -> None:
    # A streaming write passes its checkpointLocation and queryName to the sink's options.
    spark_keys = {"checkpointlocation": "/ckpt", "queryname": "totals"}
    assert SinkOptions.parse({"url": URL, **spark_keys}).url == URL
    assert SourceOptions.parse({"url": URL, "queue": "q", **spark_keys}).queue == "q"
    assert StoreOptions.parse({"path": "/d", **spark_keys}).data_dir == "/d"
