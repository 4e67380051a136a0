"""broker.auth without sockets: the user name EXTERNAL takes from a certificate, and which
mechanisms a connection is offered and may use."""

from __future__ import annotations

import pytest

from broker.auth import Auth, LoginRefused, peer_cert_name
from broker.config import CertLoginFrom
from broker.protocol.errors import ConnectionError_

# getpeercert()'s shape: a tuple of RDNs, each a tuple of (attribute, value) pairs
CERT = {"subject": (
    (("countryName", "GB"),),
    (("organizationName", "Acme, Inc."),),
    (("organizationalUnitName", "ops"), ("userId", "42")),  # a multi-valued RDN
    (("commonName", "alice"),),
)}


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


def test_external_is_offered_over_tls_only() -> None:
    auth = Auth(mechanisms=("PLAIN", "EXTERNAL"))
    assert auth.offered(tls=False) == "PLAIN"
    assert auth.offered(tls=True) == "PLAIN EXTERNAL"
    with pytest.raises(ConnectionError_) as info:
        auth.authenticate("EXTERNAL", b"", loopback=True)
    assert info.value.code == 403 and "EXTERNAL" in info.value.text


def test_a_mechanism_left_out_of_auth_mechanisms_is_refused() -> None:
    auth = Auth(mechanisms=("PLAIN",))
    auth.add_user("bob", "pw")
    assert auth.authenticate("PLAIN", b"\0bob\0pw", loopback=True) == "bob"
    with pytest.raises(ConnectionError_) as info:
        auth.authenticate("AMQPLAIN", b"", loopback=True)
    assert "unsupported authentication mechanism 'AMQPLAIN'" in info.value.text


def test_refused_password_keeps_the_reason_for_the_log() -> None:
    auth = Auth()
    auth.add_user("bob", "pw")
    with pytest.raises(LoginRefused) as info:
        auth.authenticate("PLAIN", b"\0bob\0wrong", loopback=True)
    assert info.value.text.startswith("Login was refused using authentication mechanism PLAIN")
    assert info.value.detail == "user 'bob' - invalid credentials"
