"""Size strings and memory watermarks as RabbitMQ's configuration writes them."""

from __future__ import annotations

import pytest

from broker.flow.sizes import Watermark, parse_size, parse_watermark


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500000000", 500_000_000),
        (123, 123),
        ("256MiB", 256 * 1024**2),
        ("256M", 256 * 1024**2),
        ("1GB", 1_000_000_000),
        ("1gb", 1_000_000_000),
        ("2GiB", 2 * 1024**3),
        ("50MB", 50_000_000),
        ("512k", 512 * 1024),
        ("10kB", 10_000),
        ("1.5GiB", int(1.5 * 1024**3)),
        (" 7 KiB ", 7 * 1024),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "12 parsecs", "-5", -5, "1e9"])
def test_parse_size_rejects_garbage(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_fraction_watermarks() -> None:
    assert parse_watermark(0.4) == Watermark(fraction=0.4)
    assert parse_watermark("0.4") == Watermark(fraction=0.4)
    assert parse_watermark(0.4).limit(1000) == 400


def test_absolute_watermarks() -> None:
    assert parse_watermark("256MiB") == Watermark(absolute=256 * 1024**2)
    assert parse_watermark("1GB").limit(10) == 1_000_000_000
    assert parse_watermark("500000000") == Watermark(absolute=500_000_000)


@pytest.mark.parametrize("bad", [0.0, 1.5, "0.0", "-0.2"])
def test_fraction_out_of_range(bad: str | float) -> None:
    with pytest.raises(ValueError):
        parse_watermark(bad)
