"""Sizes and watermarks as RabbitMQ writes them in its configuration.

`parse_size` (broker.config.sizes, re-exported) reads "256MiB", "1GB", "512k", "500000000".
`parse_watermark` reads vm_memory_high_watermark: a fraction of total memory (0.4, "0.4")
or an absolute size (256MiB, 1GB, 500000000)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.config.sizes import parse_size  # one size parser for the whole broker

__all__ = ["Watermark", "parse_size", "parse_watermark"]

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
