"""A body damaged on disk, found when it is read (issue 9 section 4). After a clean shutdown the
store trusts its snapshot, so 64 bytes overwritten inside a segment show only at read. Measured
before: basic.get closed the channel with 541 and the message was gone. Now the damaged record
is set aside in quarantine/, logged once, listed by hare-ctl verify and the management API,
counted in /metrics, and the consumer gets the next message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika

from broker.store.segment import scan_records
from tests.conftest import ROOT
from tests.mgmt.helpers import MgmtBroker

BODY = 8192  # above queue_index_embed_msgs_below: the bodies live in the message store


def test_damaged_body_is_set_aside_and_the_next_message_delivered(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "data").start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q.damaged", durable=True)
    for i in range(3):
        ch.basic_publish("", "q.damaged", bytes([65 + i]) * BODY,
                         pika.BasicProperties(delivery_mode=2))
    conn.close()
    b.stop()

    # overwrite 64 bytes in the middle of the second record
    store = b.queue_dir("q.damaged").parent.parent / "msg_store_persistent"  # its node's
    [segment] = sorted(store.glob("*.hseg"))
    raw = bytearray(segment.read_bytes())
    records = sorted(scan_records(bytes(raw)).records, key=lambda r: r[1])
    assert len(records) == 3
    msg_id, offset, size = records[1]
    raw[offset + size // 2: offset + size // 2 + 64] = b"\xee" * 64
    damaged = bytes(raw[offset: offset + size])
    segment.write_bytes(bytes(raw))

    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))
    ch = conn.channel()
    bodies = []
    for _ in range(3):
        method, _, body = ch.basic_get("q.damaged", auto_ack=True)
        if method is None:
            break
        bodies.append(body[:1])
    assert bodies == [b"A", b"C"]  # B was set aside; nobody saw an internal error
    assert ch.is_open
    assert ch.queue_declare("q.damaged", durable=True, passive=True).method.message_count == 0

    listed = b.get("/api/quarantine")
    assert len(listed) == 1
    entry = listed[0]
    assert (entry["msg_id"], entry["vhost"], entry["queue"], entry["store"], entry["segment"],
            entry["offset"]) == (f"{msg_id:032x}", "/", "q.damaged", "persistent",
                                 segment.name, offset)
    assert "checksum" in entry["error"]
    status, _, metrics = b.raw("/metrics")
    assert status == 200
    assert 'hare_store_quarantined_messages{store="persistent"} 1.0' in metrics
    conn.close()
    b.stop()
    assert b.log().count('"message_quarantined"') == 1

    # kept on disk as it was read, and listed offline
    assert (store / "quarantine" / f"msg-{msg_id:032x}.rec").read_bytes() == damaged
    done = subprocess.run([sys.executable, "-m", "broker.ctl", "--json", "verify",
                           str(tmp_path / "data")], capture_output=True, text=True, cwd=ROOT,
                          timeout=30)
    report = json.loads(done.stdout)
    [persistent] = [r for r in report if r["directory"] == str(store)]
    assert [m["msg_id"] for m in persistent["quarantined_messages"]] == [f"{msg_id:032x}"]
    assert persistent["quarantined"] == []
    text = subprocess.run([sys.executable, "-m", "broker.ctl", "verify", str(tmp_path / "data")],
                          capture_output=True, text=True, cwd=ROOT, timeout=30).stdout
    assert f"quarantined message {msg_id:032x} of queue 'q.damaged' in vhost '/'" in text
