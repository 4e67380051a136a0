"""Names in X.509 certificates, as RabbitMQ's rabbit_cert_info writes them: the user name
EXTERNAL takes from a verified client certificate (its common name, or its subject as
RFC 4514 text) and the subject / issuer the management API shows for a TLS connection."""

from __future__ import annotations

from typing import Any

from broker.config.values import CertLoginFrom

__all__ = ["peer_cert_name", "rfc4514"]

# RFC 4514 attribute keys for the names Python's getpeercert() gives (rabbit_cert_info's set)
_RDN_KEYS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "EMAILADDRESS",
    "serialNumber": "SERIALNUMBER",
    "surname": "SN",
    "givenName": "GIVENNAME",
    "title": "TITLE",
}


def peer_cert_name(cert: dict[str, Any] | None, login_from: CertLoginFrom) -> str | None:
    """The user name in a verified peer certificate (getpeercert()'s dict): its common
    name(s) joined with "," or its subject as an RFC 4514 string; None when there is none."""
    if not cert:
        return None
    subject: tuple[tuple[tuple[str, str], ...], ...] = cert.get("subject", ())
    if login_from is CertLoginFrom.COMMON_NAME:
        names = [value for rdn in subject for key, value in rdn if key == "commonName"]
        return ",".join(names) or None
    return rfc4514(subject) or None


def rfc4514(name: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """A certificate name (getpeercert()'s "subject" or "issuer") as RFC 4514 text, last RDN
    first, as RabbitMQ's rabbit_cert_info writes it: "CN=alice,O=Example\\, Inc.,C=GB"."""
    return ",".join("+".join(f"{_RDN_KEYS.get(k, k)}={_escape(v)}" for k, v in rdn)
                    for rdn in reversed(name))


def _escape(value: str) -> str:
    """RFC 4514 section 2.4 escaping, the characters RabbitMQ escapes."""
    out = "".join("\\" + ch if ch in ',+"\\<>;' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
