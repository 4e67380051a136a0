"""Byte sizes written the way RabbitMQ's config accepts them: "256MiB", "1GB", "50MB", "4096".

Units follow rabbitmq.conf: a bare letter or an "iB" suffix is binary (k, KiB = 1024), a "B"
suffix after the letter is decimal (kB, MB = 1000**n). Letters are case-insensitive.
"""

from __future__ import annotations

import re

__all__ = ["parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def _multiplier(unit: str) -> int | None:
    unit = unit.lower()
    if unit in ("", "b"):
        return 1
    power = _POWERS.get(unit[0])
    if power is None:
        return None
    rest = unit[1:]
    if rest in ("", "i", "ib"):
        return 1024**power
    if rest == "b":
        return 1000**power
    return None


def parse_size(text: str | int) -> int:
    """Return the size in bytes; raise ValueError naming the bad text."""
    if isinstance(text, bool):  # bool is an int subclass; True bytes means nothing
        raise ValueError(f"expected a size like 256MiB, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative, got {text}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"expected a size like 256MiB, got {text!r}")
    match = _SIZE.match(text)
    multiplier = _multiplier(match.group(2)) if match else None
    if match is None or multiplier is None:
        raise ValueError(f"expected a size like 256MiB, 50MB or 1048576, got {text!r}")
    number = match.group(1)
    if "." in number:
        return int(float(number) * multiplier)
    return int(number) * multiplier
