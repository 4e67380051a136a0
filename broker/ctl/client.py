"""What every hare-ctl verb shares: the management API client (urllib only, so the command
starts fast), the one-line error with rabbitmqctl's exit code, and the table printer."""

from __future__ import annotations

import argparse
import base64
import http
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

__all__ = [
    "DEFAULT_URL",
    "EX_DATAERR",
    "EX_NOPERM",
    "EX_SOFTWARE",
    "EX_UNAVAILABLE",
    "EX_USAGE",
    "Client",
    "CtlError",
    "Verb",
    "cell",
    "done",
    "json_arg",
    "quote_name",
    "reason_of",
    "table",
]

DEFAULT_URL = "http://127.0.0.1:15672"

# hare-ctl's registrar of a verb: (name, handler, help, vhost=False) -> the verb's parser
Verb = Callable[..., argparse.ArgumentParser]

EX_USAGE, EX_DATAERR, EX_UNAVAILABLE, EX_SOFTWARE, EX_NOPERM = 64, 65, 69, 70, 77


class CtlError(Exception):
    """A one-line failure and its exit code."""

    def __init__(self, message: str, code: int = EX_SOFTWARE) -> None:
        super().__init__(message)
        self.code = code


def json_arg(text: str, what: str) -> Any:
    """A verb's JSON argument, or the one-line error naming it."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not JSON: {exc}", EX_DATAERR) from None


# -- HTTP -----------------------------------------------------------------------------------------
class Client:
    def __init__(self, url: str, user: str, password: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.user = user
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None, what: str = "") -> Any:
        """One request; `what` names the object for a 404 ("queue 'q' in vhost '/'")."""
        status, raw = self.request(method, path, body, headers)
        if status >= 400:
            raise self._http_error(status, reason_of(raw), what or path)
        return json.loads(raw) if raw.strip() else None

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of one request, error statuses included; CtlError (69) only when
        the API cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ConnectionRefusedError):
                text = "connection refused"
            elif isinstance(reason, socket.timeout | TimeoutError):
                text = "timed out"
            else:
                text = str(getattr(reason, "strerror", None) or reason)
            raise CtlError(f"cannot reach the management API at {self.url}: {text}",
                           EX_UNAVAILABLE) from None

    def _http_error(self, status: int, reason: str, what: str) -> CtlError:
        if status == 401:
            if reason and reason != "Not_Authorized" and not reason.startswith("User '"):
                # logged in, but the user's tags or permissions do not reach this far
                return CtlError(f"access refused for user '{self.user}': {reason}", EX_NOPERM)
            why = f" ({reason})" if reason and reason != "Not_Authorized" else ""
            return CtlError(f"authentication failed for user '{self.user}' at {self.url} "
                            f"(401){why}", EX_NOPERM)
        if status == 404:
            return CtlError(f"not found: {what}", EX_DATAERR)
        phrase = reason or http.HTTPStatus(status).phrase
        return CtlError(f"{phrase} (HTTP {status})",
                        EX_DATAERR if status in (400, 403, 405) else EX_SOFTWARE)

    def get(self, path: str, what: str = "") -> Any:
        return self.call("GET", path, what=what)


def reason_of(raw: bytes) -> str:
    """The `reason` of an error answer ({"error": ..., "reason": ...}), or ""."""
    try:
        reason = json.loads(raw).get("reason", "")
    except (ValueError, AttributeError):
        return ""
    return reason if isinstance(reason, str) else str(reason)


def quote_name(name: str) -> str:
    """A name as one URL path segment (%2F for the vhost "/")."""
    return quote(name, safe="")


# -- output ---------------------------------------------------------------------------------------
def cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]"  # tags, as rabbitmqctl prints them
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """Aligned columns with a header; numbers right-aligned."""
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    numeric = [all(row[i].lstrip("-").replace(".", "", 1).isdigit() for row in cells if row[i])
               and any(row[i] for row in cells) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(columns)), *(line(row) for row in cells)])


def done(message: str) -> tuple[Any, str]:
    """A verb's result: JSON for --json, and rabbitmqctl's progress line."""
    return {"result": "ok", "message": message}, message
