"""parse_size: RabbitMQ's units (binary for k/KiB, decimal for kB/MB)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.config import parse_size

UNITS = {
    "": 1,
    "B": 1,
    "k": 1024,
    "K": 1024,
    "KiB": 1024,
    "kiB": 1024,
    "kB": 1000,
    "KB": 1000,
    "M": 1024**2,
    "MiB": 1024**2,
    "MB": 1000**2,
    "mb": 1000**2,
    "G": 1024**3,
    "GiB": 1024**3,
    "GB": 1000**3,
    "TiB": 1024**4,
    "TB": 1000**4,
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256MiB", 256 * 1024**2),
        ("1GB", 10**9),
        ("50MB", 50 * 10**6),
        ("1048576", 1048576),
        (" 16 MiB ", 16 * 1024**2),
        ("1.5GiB", 3 * 1024**3 // 2),
        (4096, 4096),
        (0, 0),
    ],
)
def test_examples(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(UNITS)))
def test_every_unit_multiplies(number: int, unit: str) -> None:
    assert parse_size(f"{number}{unit}") == number * UNITS[unit]


@pytest.mark.parametrize("bad", ["", "MiB", "-1", "1 parsec", "1XB", "1KiBB", "1e6", -5, True])
def test_rejects_with_the_text(bad: str | int) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(bad)
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)
