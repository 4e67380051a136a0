"""AMQP values as column values, shared by Hare's sources (no Spark session needed)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from broker.spark.columns import header_strings


def test_header_strings_keep_every_field_table_type_readable() -> None:
    table = {
        "s": "text", "i": -7, "f": 2.5, "t": True, "no": False, "v": None,
        "b": bytearray(b"caf\xc3\xa9\xff"), "d": Decimal("1.50"),
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "table": {"a": [1, "x", None, {"deep": b"y"}], "ok": True},
    }
    assert header_strings(table) == [
        ("s", "text"), ("i", "-7"), ("f", "2.5"), ("t", "true"), ("no", "false"), ("v", None),
        ("b", "café\ufffd"), ("d", "1.50"), ("ts", "2024-01-02T03:04:05+00:00"),
        ("table", '{"a":[1,"x",null,{"deep":"y"}],"ok":true}'),
    ]
    assert header_strings(None) is None and header_strings({}) == []
