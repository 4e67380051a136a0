"""The handshake's rules (broker/protocol/handshake.py) with plain values, no loop or socket;
tests/server/test_connection.py checks the same rules end to end."""

from __future__ import annotations

import pytest

from broker.protocol import handshake as hs
from broker.protocol.constants import ACCESS_REFUSED, FRAME_MIN_SIZE, NOT_ALLOWED, PROTOCOL_HEADER
from broker.protocol.errors import ConnectionError_
from broker.protocol.handshake import HeaderVerdict, Tune

SERVER = Tune(channel_max=2047, frame_max=131072, heartbeat=60)


@pytest.mark.parametrize("n", range(8))
def test_a_prefix_of_the_header_waits_for_more(n):
    prefix = PROTOCOL_HEADER[:n]
    assert hs.protocol_header(prefix) == (HeaderVerdict.INCOMPLETE, prefix)


def test_the_header_is_accepted_and_what_follows_kept():
    buf = PROTOCOL_HEADER + b"\x01rest"
    assert hs.protocol_header(buf) == (HeaderVerdict.ACCEPTED, b"\x01rest")


@pytest.mark.parametrize("buf", [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x09xyz", b"GET ",
                                 b"HTTP/1.1 200"])
def test_another_header_is_refused(buf):
    assert hs.protocol_header(buf) == (HeaderVerdict.REFUSED, buf[:8])


def test_start_offers_the_mechanisms_and_capabilities():
    start = hs.connection_start("1.2.3", "hare@host", ["PLAIN", "AMQPLAIN"])
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN"
    assert start.locales == "en_US"
    props = start.server_properties
    assert (props["product"], props["version"], props["cluster_name"]) == (
        "Hare", "1.2.3", "hare@host")
    assert props["capabilities"] is hs.SERVER_CAPABILITIES
    assert hs.SERVER_CAPABILITIES["connection.blocked"] is True


def test_tune_takes_the_clients_smaller_limits_and_its_heartbeat():
    assert hs.negotiate_tune(SERVER, Tune(100, 4096, 0)) == Tune(100, 4096, 0)
    assert hs.negotiate_tune(SERVER, Tune(2047, 131072, 600)) == Tune(2047, 131072, 600)


def test_channel_max_zero_keeps_the_servers_when_it_has_none():
    assert hs.negotiate_tune(Tune(0, 131072, 60), Tune(0, 8192, 60)).channel_max == 0
    assert hs.negotiate_tune(Tune(0, 131072, 60), Tune(5, 8192, 60)).channel_max == 5


@pytest.mark.parametrize(
    ("client", "text"),
    [
        (Tune(10, FRAME_MIN_SIZE - 1, 0), f"frame_max={FRAME_MIN_SIZE - 1} < {FRAME_MIN_SIZE} min"),
        (Tune(10, 131073, 0), "frame_max=131073 > 131072 max size"),
        (Tune(10, 0, 0), "frame_max=0 > 131072 max size"),  # 0: no limit, above ours
        (Tune(2048, 4096, 0), "channel_max=2048 > 2047 max"),
        (Tune(0, 4096, 0), "channel_max=0 > 2047 max"),
    ],
)
def test_tune_above_the_servers_limits_is_530(client, text):
    with pytest.raises(ConnectionError_) as err:
        hs.negotiate_tune(SERVER, client)
    assert err.value.code == NOT_ALLOWED
    assert err.value.text.startswith(text)


def test_whole_publishes_skip_the_assembler_only_if_no_body_frame_can_be_too_big():
    assert hs.whole_publishes_fit(131072, 131072)
    assert hs.whole_publishes_fit(4088, 4096)
    assert not hs.whole_publishes_fit(4087, 4096)


def test_channel_count_against_channel_max():
    hs.check_channel_count(9, 10)
    hs.check_channel_count(65534, 0)  # 0: the protocol's limit
    for opened, channel_max, shown in [(10, 10, 10), (65535, 0, 65535)]:
        with pytest.raises(ConnectionError_) as err:
            hs.check_channel_count(opened, channel_max)
        assert err.value.code == NOT_ALLOWED
        assert err.value.text == (f"number of channels opened ({opened}) has reached the "
                                  f"negotiated channel_max ({shown})")


def test_refused_logins_say_rabbitmqs_texts_not_the_reason():
    refused = hs.login_refused("PLAIN", "bob", loopback_only=False)
    assert refused.code == ACCESS_REFUSED and refused.method == (0, 0)
    assert refused.text == ("Login was refused using authentication mechanism PLAIN. "
                            "For details see the broker logfile.")
    local = hs.login_refused("PLAIN", "guest", loopback_only=True)
    assert (local.code, local.text) == (ACCESS_REFUSED,
                                        "User 'guest' can only connect via localhost")
    other = hs.unsupported_mechanism("CRAM-MD5")
    assert (other.code, other.text) == (ACCESS_REFUSED,
                                        "unsupported authentication mechanism 'CRAM-MD5'")


def test_client_capabilities_and_name():
    props = {"product": b"pika", "version": "1.3", "capabilities": {"connection.blocked": True,
                                                                    "basic.nack": False}}
    assert hs.client_capability(props, "connection.blocked")
    assert not hs.client_capability(props, "basic.nack")
    assert not hs.client_capability(props, "consumer_cancel_notify")
    assert not hs.client_capability({"capabilities": "yes"}, "connection.blocked")
    assert not hs.client_capability({}, "connection.blocked")
    assert hs.client_name(props) == "pika 1.3"
    assert hs.client_name({}) == ""
