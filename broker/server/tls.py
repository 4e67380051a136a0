"""TLS for the listeners (AMQPS and the management's HTTPS), from the standard library's `ssl`.

`TlsOptions` is RabbitMQ's ssl_options for one listener; `server_context` turns it into an
SSLContext or one line saying which file is wrong."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from broker.config.values import SslVerify, TlsVersion

if TYPE_CHECKING:
    from broker.config import Settings

__all__ = ["TlsError", "TlsOptions", "server_context", "tls_context"]

_VERSIONS = {TlsVersion.TLS1_2: ssl.TLSVersion.TLSv1_2, TlsVersion.TLS1_3: ssl.TLSVersion.TLSv1_3}

class TlsError(Exception):
    """A certificate, key or CA file that cannot be used: one line naming the setting."""


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """One listener's TLS settings; `prefix` is their key prefix ("ssl", "management_ssl")."""

    prefix: str
    certfile: Path
    keyfile: Path | None
    cacertfile: Path | None
    verify: SslVerify
    fail_if_no_peer_cert: bool
    min_version: TlsVersion


def tls_context(settings: Settings, prefix: str) -> ssl.SSLContext | None:
    """The context of the listener whose keys start with `prefix` ("ssl", "management_ssl"),
    or None when its certfile is unset (the listener is off)."""
    certfile = getattr(settings, f"{prefix}_certfile")
    if certfile is None:
        return None
    return server_context(TlsOptions(
        prefix,
        certfile,
        getattr(settings, f"{prefix}_keyfile"),
        getattr(settings, f"{prefix}_cacertfile"),
        getattr(settings, f"{prefix}_verify"),
        getattr(settings, f"{prefix}_fail_if_no_peer_cert"),
        getattr(settings, f"{prefix}_min_version"),
    ))


def _readable(prefix: str, key: str, path: Path) -> None:
    try:
        with path.open("rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise TlsError(f"{prefix}_{key} {path}: cannot read ({exc.strerror or exc})") from None


def _no_password() -> bytes:
    # without a callback OpenSSL would prompt on the terminal for an encrypted key
    raise TlsError("encrypted private keys are not supported")


def server_context(opts: TlsOptions) -> ssl.SSLContext:
    """An SSLContext for a server socket, or TlsError naming the setting and the problem."""
    p = opts.prefix
    _readable(p, "certfile", opts.certfile)
    if opts.keyfile is not None:
        _readable(p, "keyfile", opts.keyfile)
    if opts.cacertfile is not None:
        _readable(p, "cacertfile", opts.cacertfile)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[opts.min_version]
    try:
        ctx.load_cert_chain(opts.certfile, opts.keyfile, password=_no_password)
    except (ssl.SSLError, TlsError) as exc:
        files = f"{p}_certfile {opts.certfile}"
        if opts.keyfile is not None:
            files += f" / {p}_keyfile {opts.keyfile}"
        raise TlsError(
            f"{files}: not a PEM certificate with its private key{_reason(exc)}"
        ) from None
    if opts.cacertfile is not None:
        try:
            ctx.load_verify_locations(cafile=opts.cacertfile)
        except ssl.SSLError as exc:
            raise TlsError(
                f"{p}_cacertfile {opts.cacertfile}: no PEM CA certificates in it{_reason(exc)}"
            ) from None
    # Erlang's ssl semantics: verify_peer asks for a certificate and checks any that comes;
    # fail_if_no_peer_cert also refuses a client that sends none.
    if opts.verify is SslVerify.VERIFY_PEER:
        ctx.verify_mode = ssl.CERT_REQUIRED if opts.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _reason(exc: Exception) -> str:
    """OpenSSL's reason in words ("key values mismatch"), or "" when it gives none (a file
    without PEM data in it)."""
    if isinstance(exc, ssl.SSLError):
        return f" ({exc.reason.lower().replace('_', ' ')})" if exc.reason else ""
    return f" ({exc})"
