"""Password hashes in RabbitMQ's rabbit_password_hashing_sha256 format.

A stored hash is base64(salt + sha256(salt + utf8(password))) with a 4-byte random salt, so
hashes exported from RabbitMQ's definitions load here unchanged and the other way round.
This is the one hashing function in Hare: the config loader and the definitions store both use
it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

__all__ = ["SALT_BYTES", "check_password", "hash_password", "is_password_hash"]

SALT_BYTES = 4
_DIGEST_BYTES = hashlib.sha256().digest_size


def hash_password(password: str, salt: bytes | None = None) -> str:
    """Hash `password` with a fresh random salt (or the given 4-byte one, for tests)."""
    if salt is None:
        salt = os.urandom(SALT_BYTES)
    elif len(salt) != SALT_BYTES:
        raise ValueError(f"salt must be {SALT_BYTES} bytes, got {len(salt)}")
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


# RabbitMQ's hashing modules, told apart by digest length (rabbit_password_hashing_md5,
# _sha256, _sha512), so any RabbitMQ definitions export loads; new hashes are always sha256.
_BY_DIGEST_SIZE = {16: hashlib.md5, 32: hashlib.sha256, 64: hashlib.sha512}


def _decode(stored: str) -> bytes | None:
    try:
        raw = base64.b64decode(stored.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    return raw if len(raw) - SALT_BYTES in _BY_DIGEST_SIZE else None


def is_password_hash(stored: str) -> bool:
    """True when `stored` has the shape of a RabbitMQ password hash this module can check."""
    return _decode(stored) is not None


def check_password(password: str, stored: str) -> bool:
    """True when `password` matches `stored`; a malformed hash never matches."""
    raw = _decode(stored)
    if raw is None:
        return False
    salt, expected = raw[:SALT_BYTES], raw[SALT_BYTES:]
    actual = _BY_DIGEST_SIZE[len(expected)](salt + password.encode("utf-8")).digest()
    # Constant-time comparison: the hash must not leak through timing.
    return hmac.compare_digest(actual, expected)
