"""broker.access without sockets: the user name EXTERNAL takes from a certificate, which
mechanisms a connection is offered, and a refused login keeping its reason for the log."""

from __future__ import annotations

import pytest

from broker.access import (
    AccessControl,
    Credentials,
    InternalBackend,
    LoginRefused,
    MechanismError,
    UserDB,
    offered,
    parse_response,
    peer_cert_name,
)
from broker.config import CertLoginFrom

# getpeercert()'s shape: a tuple of RDNs, each a tuple of (attribute, value) pairs
CERT = {"subject": (
    (("countryName", "GB"),),
    (("organizationName", "Acme, Inc."),),
    (("organizationalUnitName", "ops"), ("userId", "42")),  # a multi-valued RDN
    (("commonName", "alice"),),
)}


class _TLS:
    """What parse_response asks of an ssl.SSLObject."""

    def __init__(self, cert: dict[str, object] | None) -> None:
        self.cert = cert

    def getpeercert(self) -> dict[str, object] | None:
        return self.cert


def test_common_name() -> None:
    assert peer_cert_name(CERT, CertLoginFrom.COMMON_NAME) == "alice"


def test_distinguished_name_is_rfc4514_last_rdn_first_and_escaped() -> None:
    assert peer_cert_name(CERT, CertLoginFrom.DISTINGUISHED_NAME) == (
        "CN=alice,OU=ops+UID=42,O=Acme\\, Inc.,C=GB")


def test_several_common_names_are_joined_and_none_is_no_name() -> None:
    two = {"subject": ((("commonName", "a"),), (("commonName", "b"),))}
    assert peer_cert_name(two, CertLoginFrom.COMMON_NAME) == "a,b"
    none = {"subject": ((("organizationName", "x"),),)}
    assert peer_cert_name(none, CertLoginFrom.COMMON_NAME) is None
    assert peer_cert_name({}, CertLoginFrom.DISTINGUISHED_NAME) is None
    assert peer_cert_name(None, CertLoginFrom.COMMON_NAME) is None


def test_external_is_offered_over_tls_only_and_needs_a_certificate() -> None:
    mechanisms = ("PLAIN", "EXTERNAL")
    assert offered(mechanisms, tls=False) == ("PLAIN",)
    assert offered(mechanisms, tls=True) == ("PLAIN", "EXTERNAL")
    with pytest.raises(MechanismError, match="no TLS"):
        parse_response("EXTERNAL", b"", tls=None)
    with pytest.raises(MechanismError, match="no name"):
        parse_response("EXTERNAL", b"", tls=_TLS({"subject": ()}))  # type: ignore[arg-type]
    creds = parse_response("EXTERNAL", b"ignored", tls=_TLS(CERT))  # type: ignore[arg-type]
    assert creds == Credentials.verified("alice") and creds.password is None


def _auth() -> AccessControl:
    users = UserDB()
    users.add_user("bob", "pw")
    return AccessControl(users, [InternalBackend(users)])


def test_external_logs_in_an_existing_user_without_a_password() -> None:
    auth = _auth()
    who = auth.login(Credentials.verified("bob"), mechanism="EXTERNAL", peer="p", loopback=True)
    assert who.name == "bob"  # type: ignore[union-attr]
    with pytest.raises(LoginRefused) as info:
        auth.login(Credentials.verified("carol"), mechanism="EXTERNAL", peer="p", loopback=True)
    assert info.value.reason == "internal: user 'carol' - invalid credentials"


def test_refused_password_keeps_the_reason_for_the_log() -> None:
    auth = _auth()
    assert parse_response("PLAIN", b"\0bob\0pw") == Credentials("bob", "pw")
    with pytest.raises(LoginRefused) as info:
        auth.login(parse_response("PLAIN", b"\0bob\0wrong"), mechanism="PLAIN", peer="p",
                   loopback=True)
    assert info.value.reason == "internal: user 'bob' - invalid credentials"
    assert auth.attempts["amqp091"].failed == 1
    with pytest.raises(MechanismError):
        parse_response("PLAIN", b"bob-without-separators")


def test_the_direct_secret_logs_in_any_existing_user_over_loopback_amqp_only() -> None:
    """The node's own clients (shovels) act as a user without its password; from another
    peer, over HTTP, or for a user that does not exist, the secret is a wrong password."""
    auth = _auth()
    secret = auth.direct_secret
    assert len(secret) >= 40 and secret != _auth().direct_secret  # random per node start
    who = auth.login(Credentials("bob", secret), mechanism="PLAIN", peer="p", loopback=True)
    assert who.name == "bob"  # type: ignore[union-attr]
    for user, loopback, protocol in (("bob", False, "amqp091"), ("bob", True, "http"),
                                     ("carol", True, "amqp091")):
        with pytest.raises(LoginRefused) as info:
            auth.login(Credentials(user, secret), mechanism="PLAIN", peer="p",
                       loopback=loopback, protocol=protocol)
        assert info.value.reason == f"internal: user '{user}' - invalid credentials"
        assert secret not in info.value.reason
