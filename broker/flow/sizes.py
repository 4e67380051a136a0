"""Sizes and watermarks as RabbitMQ writes them in its configuration.

`parse_size` reads "256MiB", "1GB", "512k", "500000000"; units follow rabbit's: k/K, kiB/KiB,
M, MiB, G, GiB are powers of 1024; kB/KB, MB, GB are powers of 1000.
`parse_watermark` reads vm_memory_high_watermark: a fraction of total memory (0.4, "0.4")
or an absolute size (256MiB, 1GB, 500000000)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Watermark", "parse_size", "parse_watermark"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int) -> int:
    """Bytes from an int or a size string. Raises ValueError naming the bad value."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    m = _SIZE.match(value)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ValueError(f"not a size: {value!r}")
    return int(float(m.group(1)) * unit)


@dataclass(frozen=True, slots=True)
class Watermark:
    """Either `fraction` of total memory or `absolute` bytes (exactly one is set)."""

    fraction: float | None = None
    absolute: int | None = None

    def limit(self, total_bytes: int) -> int:
        if self.absolute is not None:
            return self.absolute
        assert self.fraction is not None
        return int(total_bytes * self.fraction)

    def __str__(self) -> str:
        return str(self.fraction) if self.absolute is None else f"{self.absolute} bytes"


def parse_watermark(value: str | float) -> Watermark:
    """A float (or a string with a decimal point and no unit) is a fraction of total memory;
    an int or a size string is an absolute limit."""
    if isinstance(value, float):
        return _fraction(value)
    if isinstance(value, str) and "." in value and _is_number(value):
        return _fraction(float(value))
    return Watermark(absolute=parse_size(value))


def _fraction(f: float) -> Watermark:
    if not 0.0 < f <= 1.0:
        raise ValueError(f"a relative memory watermark must be in (0, 1]: {f}")
    return Watermark(fraction=f)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
