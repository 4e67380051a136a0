"""Password hashes compatible with RabbitMQ's rabbit_password_hashing_sha256."""

from __future__ import annotations

import base64
import hashlib

import pytest

from broker.config import check_password, hash_password, is_password_hash


def test_format_is_base64_of_salt_and_sha256() -> None:
    salt = b"\x90\x8d\xc6\x0a"
    stored = hash_password("test12", salt)
    raw = base64.b64decode(stored)
    assert raw[:4] == salt
    assert raw[4:] == hashlib.sha256(salt + b"test12").digest()


def test_known_rabbitmq_hash() -> None:
    # From RabbitMQ's docs on credentials: the hash of "test12" with salt 908DC60A.
    assert check_password("test12", "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR")


def test_round_trip_with_random_salt() -> None:
    first, second = hash_password("pässword"), hash_password("pässword")
    assert first != second  # fresh salt each time
    assert check_password("pässword", first) and check_password("pässword", second)
    assert not check_password("password", first)
    assert is_password_hash(first)


@pytest.mark.parametrize("stored", ["", "not base64!", "c2hvcnQ=", "guest", "é"])
def test_malformed_hash_never_matches(stored: str) -> None:
    assert not is_password_hash(stored)
    assert not check_password("guest", stored)


def test_salt_must_be_four_bytes() -> None:
    with pytest.raises(ValueError):
        hash_password("x", b"12345")
