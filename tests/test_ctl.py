"""hare-ctl (python -m broker.ctl) against a real broker: tables, --json, admin verbs seen by
AMQP clients, one-line errors with rabbitmqctl's exit codes, and `verify` on a stopped store."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest
from aio_pika import DeliveryMode, Message
from mgmt.helpers import MgmtBroker, free_port

from broker.store.layout import STREAMS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtBroker]:
    b = MgmtBroker(tmp_path_factory.mktemp("ctl") / "data").start()
    yield b
    b.stop()


def run_ctl(*args: str, url: str | None = None, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    if url is not None:
        env["HARE_MANAGEMENT_URL"] = url
    return subprocess.run([sys.executable, "-m", "broker.ctl", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=30, input=stdin)


async def ctl(mb: MgmtBroker, *args: str, stdin: str | None = None
              ) -> subprocess.CompletedProcess[str]:
    """Run hare-ctl without blocking the test's AMQP clients."""
    return await asyncio.to_thread(run_ctl, *args, url=mb.http, stdin=stdin)


async def test_list_verbs_tables_and_json(mb: MgmtBroker) -> None:
    conn = await aio_pika.connect(mb.url, client_properties={"connection_name": "ctl-lists"})
    ch = await conn.channel()
    q = await ch.declare_queue("ctl.q")
    ex = await ch.declare_exchange("ctl.x", aio_pika.ExchangeType.FANOUT)
    await q.bind(ex, routing_key="rk")
    for _ in range(3):
        await ex.publish(Message(b"m"), routing_key="")
    await mb.until("/api/queues/%2F/ctl.q", lambda d: d["messages"] == 3)
    async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """Keep the delivery unacknowledged."""

    tag = await q.consume(hold, no_ack=False)
    await mb.until("/api/queues/%2F/ctl.q", lambda d: d["messages_unacknowledged"] == 3)

    done = await ctl(mb, "list_queues")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["name", "messages"]
    assert ["ctl.q", "3"] in [line.split() for line in lines]
    assert lines[0].index("messages") == lines[1 + [x.split()[0] for x in lines[1:]].index(
        "ctl.q")].index("3") - len("messages") + 1  # numbers right-aligned under the header

    done = await ctl(mb, "--json", "list_queues", "name", "messages_ready", "consumers")
    rows = json.loads(done.stdout)
    assert {"name": "ctl.q", "messages_ready": 0, "consumers": 1} in rows

    done = await ctl(mb, "list_exchanges", "--json")  # options after the verb work too
    assert {"name": "ctl.x", "type": "fanout"} in json.loads(done.stdout)
    assert {"name": "amq.topic", "type": "topic"} in json.loads(done.stdout)

    bindings = json.loads((await ctl(mb, "--json", "list_bindings")).stdout)
    assert {"source_name": "ctl.x", "source_kind": "exchange", "destination_name": "ctl.q",
            "destination_kind": "queue", "routing_key": "rk", "arguments": {}} in bindings

    conns = json.loads((await ctl(mb, "--json", "list_connections")).stdout)
    assert {"user": "guest", "peer_host": "127.0.0.1", "state": "running"}.items() <= conns[
        0].items()
    consumers = json.loads((await ctl(mb, "--json", "list_consumers")).stdout)
    [mine] = [c for c in consumers if c["queue_name"] == "ctl.q"]
    assert (mine["consumer_tag"], mine["ack_required"], mine["active"]) == (tag, True, True)

    done = await ctl(mb, "list_queues", "nonsense")
    assert done.returncode == 64 and "unknown column(s) for list_queues: nonsense" in (
        done.stderr)

    status = await ctl(mb, "status")
    assert status.returncode == 0
    assert status.stdout.startswith("Status of node hare@")
    listeners = next(line for line in status.stdout.splitlines()
                     if line.startswith("listeners"))
    assert f"amqp [::]:{mb.port}" in listeners
    assert f"http 127.0.0.1:{mb.mgmt_port}" in listeners
    data = json.loads((await ctl(mb, "status", "--json")).stdout)
    assert data["queues"] >= 1 and data["connections"] >= 1 and data["alarms"] == []
    await conn.close()


async def test_admin_verbs_are_seen_by_amqp(mb: MgmtBroker, tmp_path: Path) -> None:
    assert (await ctl(mb, "add_vhost", "ctl-vh")).returncode == 0
    done = await ctl(mb, "add_user", "dave", "pw", "--tags", "monitoring")
    assert done.returncode == 0 and done.stdout.strip() == 'Adding user "dave" ...'
    assert (await ctl(mb, "set_permissions", "-p", "ctl-vh", "dave", ".*", ".*", ".*")
            ).returncode == 0
    conn = await aiormq.connect(f"amqp://dave:pw@127.0.0.1:{mb.port}/ctl-vh")
    ch = await conn.channel()
    await ch.queue_declare("work")
    for _ in range(2):
        await ch.basic_publish(b"x", routing_key="work")
    await mb.until("/api/queues/ctl-vh/work", lambda d: d["messages"] == 2)
    users = json.loads((await ctl(mb, "--json", "list_users")).stdout)
    assert {"name": "dave", "tags": ["monitoring"]} in users

    assert (await ctl(mb, "purge_queue", "-p", "ctl-vh", "work")).returncode == 0
    assert (await ch.queue_declare("work", passive=True)).message_count == 0

    # export, delete, import: the queue comes back
    await ch.queue_declare("kept", durable=True)
    out = tmp_path / "defs.json"
    assert (await ctl(mb, "export_definitions", str(out))).returncode == 0
    assert {"name": "kept", "vhost": "ctl-vh"}.items() <= next(
        q for q in json.loads(out.read_text())["queues"] if q["name"] == "kept").items()
    assert (await ctl(mb, "delete_queue", "-p", "ctl-vh", "kept")).returncode == 0
    assert mb.api("GET", "/api/queues/ctl-vh/kept")[0] == 404
    assert (await ctl(mb, "import_definitions", str(out))).returncode == 0
    assert mb.get("/api/queues/ctl-vh/kept")["durable"] is True

    # close_connection: the client sees 320 with our reason
    [info] = [c for c in mb.get("/api/connections") if c["user"] == "dave"]
    done = await ctl(mb, "close_connection", info["name"], "go away")
    assert done.returncode == 0, done.stderr
    with pytest.raises(aiormq.exceptions.ConnectionClosed) as closed:
        await asyncio.wait_for(conn.closing, 5)
    assert closed.value.args[0] == 320 and "go away" in closed.value.args[1]

    assert (await ctl(mb, "delete_user", "dave")).returncode == 0
    assert (await ctl(mb, "delete_vhost", "ctl-vh")).returncode == 0
    assert mb.api("GET", "/api/vhosts/ctl-vh")[0] == 404


async def test_errors_are_one_line_with_exit_codes(mb: MgmtBroker) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = await asyncio.to_thread(run_ctl, "list_queues", url=url)
    assert done.returncode == 69
    assert done.stderr == f"hare-ctl: cannot reach the management API at {url}: " \
                          "connection refused\n"
    assert done.stdout == ""

    done = await ctl(mb, "--password", "wrong", "status")
    assert done.returncode == 77
    assert done.stderr == f"hare-ctl: authentication failed for user 'guest' at {mb.http} " \
                          "(401)\n"

    done = await ctl(mb, "purge_queue", "no-such-queue")
    assert done.returncode == 65
    assert done.stderr == "hare-ctl: not found: queue 'no-such-queue' in vhost '/'\n"
    done = await ctl(mb, "set_permissions", "nobody", ".*", ".*", ".*")
    assert done.returncode == 65
    assert done.stderr == "hare-ctl: user 'nobody' does not exist (HTTP 400)\n"


def test_verify_a_stopped_broker_store(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "data").start()

    async def publish() -> None:
        conn = await aio_pika.connect(b.url)
        ch = await conn.channel()
        q = await ch.declare_queue("v.q", durable=True)
        for i in range(20):
            await ch.default_exchange.publish(
                Message(b"%05d" % i * 2000, delivery_mode=DeliveryMode.PERSISTENT),
                routing_key=q.name)
        await conn.close()

    asyncio.run(publish())
    b.stop()
    home = b.queue_dir("v.q").parent.parent  # the node directory (a worker's) holding v.q
    done = run_ctl("verify", str(tmp_path / "data"))
    assert done.returncode == 0, done.stdout + done.stderr
    [first] = [x for x in done.stdout.splitlines()
               if x.startswith(f"{home / 'msg_store_persistent'}: ok (")]
    assert "20 message(s)" in first and "clean shutdown: true" in first
    queues = f"{home / 'queues'}: ok (1 queue index(es), 1 segment(s), 20 message(s)"
    assert queues in done.stdout
    report = json.loads(run_ctl("--json", "verify", str(tmp_path / "data")).stdout)
    [store] = [r for r in report if r["directory"] == str(home / "msg_store_persistent")]
    assert store["ok"] is True and store["messages"] == 20

    # flip a byte inside a record: verify reports it and exits non-zero
    [segment] = sorted((home / "msg_store_persistent").glob("*.hseg"))
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    segment.write_bytes(bytes(raw))
    done = run_ctl("verify", str(tmp_path / "data"))
    assert done.returncode == 65
    assert ": DAMAGED (" in done.stdout
    assert f"{segment.name}: corrupt record at" in done.stdout

    missing = run_ctl("verify", str(tmp_path / "nope"))
    assert missing.returncode == 65 and "is not a directory" in missing.stderr


def test_verify_a_stopped_broker_streams(tmp_path: Path) -> None:
    """verify walks every chunk of every stream segment: a flipped byte inside a chunk is a
    corrupt chunk, bytes cut off at the end a torn tail."""
    b = MgmtBroker(tmp_path / "data").start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("v.s", durable=True, arguments={"x-queue-type": "stream",
                                                     "x-stream-max-segment-size-bytes": 4000})
    ch.confirm_delivery()
    for i in range(30):
        ch.basic_publish("", "v.s", b"%05d" % i * 100)
    conn.close()
    b.stop()
    done = run_ctl("verify", str(tmp_path / "data"))
    assert done.returncode == 0, done.stdout + done.stderr
    streams = b.queue_dir("v.s", STREAMS).parent
    line = next(x for x in done.stdout.splitlines() if x.startswith(str(streams)))
    assert line.startswith(f"{streams}: ok (1 stream(s), ") and "30 message(s)" in line

    segments = sorted(streams.glob("*/*.hstr"))
    assert len(segments) > 2
    raw = bytearray(segments[0].read_bytes())
    raw[16 + 40] ^= 0xFF  # inside the first chunk's payload; more chunks follow it
    segments[0].write_bytes(bytes(raw))
    with open(segments[-1], "ab") as f:
        f.write(b"\x00\x00\x00\x01torn")
    done = run_ctl("verify", str(tmp_path / "data"))
    assert done.returncode == 65
    first, last = (f"{p.parent.name}/{p.name}" for p in (segments[0], segments[-1]))
    assert f"{first}: corrupt chunk at 16 (" in done.stdout
    assert f"{last}: torn tail of 8 bytes" in done.stdout


def test_verify_checks_every_workers_directory(tmp_path: Path) -> None:
    """A multi-worker server's data directory holds a node directory per worker (w1, w2):
    verify checks each, not the top, which has no store of its own."""
    b = MgmtBroker(tmp_path / "data", ["--workers", "2"]).start(60)
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("v.w", durable=True)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", "v.w", b"%05d" % i * 2000,  # big: kept in the store
                         pika.BasicProperties(delivery_mode=2))
    conn.close()
    b.stop()
    report = json.loads(run_ctl("--json", "verify", str(tmp_path / "data")).stdout)
    stores = {r["directory"]: r["messages"] for r in report if r["ok"] and "duplicates" in r}
    assert set(stores) == {str(tmp_path / "data" / w / m) for w in ("w1", "w2")
                           for m in ("msg_store_persistent", "msg_store_transient")}
    assert sum(stores.values()) == 5


async def test_list_queues_shows_the_real_type(mb: MgmtBroker) -> None:
    conn = await aio_pika.connect(mb.url)
    ch = await conn.channel()
    await ch.declare_queue("ctl.quorum", durable=True, arguments={"x-queue-type": "quorum"})
    await ch.declare_queue("ctl.stream", durable=True, arguments={"x-queue-type": "stream"})
    done = await ctl(mb, "list_queues", "name", "type")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert ["ctl.quorum", "quorum"] in rows and ["ctl.stream", "stream"] in rows
    # a quorum queue's leader, members and online members, as rabbitmqctl's items
    await ch.declare_queue("ctl.classic", auto_delete=True)  # a row without those columns
    done = await ctl(mb, "--json", "list_queues", "name", "leader", "members", "online")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {"name": "ctl.classic", "leader": None, "members": None, "online": None} in rows
    row = next(r for r in rows if r["name"] == "ctl.quorum")
    assert row["members"] == row["online"] == [row["leader"]] and row["leader"]
    sac = await ch.declare_queue("ctl.sac", auto_delete=True,
                                 arguments={"x-single-active-consumer": True})

    async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """Keep the delivery unacknowledged."""

    await sac.consume(hold, consumer_tag="a")
    await sac.consume(hold, consumer_tag="b")
    done = await ctl(mb, "--json", "list_consumers", "consumer_tag", "active", "activity_status")
    rows = json.loads(done.stdout)
    assert {"consumer_tag": "a", "active": True, "activity_status": "single_active"} in rows
    assert {"consumer_tag": "b", "active": False, "activity_status": "waiting"} in rows
    for name in ("ctl.quorum", "ctl.stream"):
        await ch.queue_delete(name)
    await conn.close()


async def test_policy_verbs(mb: MgmtBroker) -> None:
    assert (await ctl(mb, "add_vhost", "ctl-pol")).returncode == 0
    done = await ctl(mb, "set_policy", "-p", "ctl-pol", "--priority", "3", "--apply-to",
                     "queues", "cap", "^c", '{"max-length": 1}')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ('Setting policy "cap" for pattern "^c" to '
                                   '"{"max-length": 1}" with priority "3" for vhost '
                                   '"ctl-pol" ...')
    conn = await aiormq.connect(f"amqp://guest:guest@127.0.0.1:{mb.port}/ctl-pol")
    ch = await conn.channel()
    await ch.queue_declare("capped")
    for body in (b"1", b"2"):
        await ch.basic_publish(body, routing_key="capped")
    assert (await ch.queue_declare("capped", passive=True)).message_count == 1

    lines = (await ctl(mb, "list_policies", "-p", "ctl-pol")).stdout.splitlines()
    assert lines[0].split() == ["vhost", "name", "pattern", "apply-to", "definition",
                                "priority"]
    assert lines[1].split() == ["ctl-pol", "cap", "^c", "queues", '{"max-length":1}', "3"]
    done = await ctl(mb, "set_operator_policy", "-p", "ctl-pol", "op", "^c",
                     '{"message-ttl": 60000}')
    assert done.returncode == 0, done.stderr
    rows = json.loads((await ctl(mb, "--json", "list_operator_policies", "-p", "ctl-pol")
                       ).stdout)
    assert rows == [{"vhost": "ctl-pol", "name": "op", "pattern": "^c", "apply-to": "all",
                     "definition": {"message-ttl": 60000}, "priority": 0}]
    assert mb.get("/api/queues/ctl-pol/capped")["operator_policy"] == "op"

    done = await ctl(mb, "set_policy", "-p", "ctl-pol", "bad", "^c", '{"max-length": -5}')
    assert done.returncode == 65
    assert done.stderr == ("hare-ctl: Validation failed\n\n-5 is not a valid maximum length\n"
                           " (HTTP 400)\n")
    done = await ctl(mb, "set_policy", "-p", "ctl-pol", "bad", "^c", "nojson")
    assert done.returncode == 65 and done.stderr.startswith("hare-ctl: definition is not JSON")

    assert (await ctl(mb, "clear_policy", "-p", "ctl-pol", "cap")).returncode == 0
    await ch.basic_publish(b"3", routing_key="capped")
    assert (await ch.queue_declare("capped", passive=True)).message_count == 2
    done = await ctl(mb, "clear_policy", "-p", "ctl-pol", "cap")
    assert done.returncode == 65
    assert done.stderr == "hare-ctl: not found: policy 'cap' in vhost 'ctl-pol'\n"
    assert (await ctl(mb, "clear_operator_policy", "-p", "ctl-pol", "op")).returncode == 0
    assert mb.get("/api/operator-policies/ctl-pol") == []
    await conn.close()
    assert (await ctl(mb, "delete_vhost", "ctl-pol")).returncode == 0


async def test_vhost_limit_verbs(mb: MgmtBroker) -> None:
    assert (await ctl(mb, "add_vhost", "ctl-lim")).returncode == 0
    done = await ctl(mb, "set_vhost_limits", "-p", "ctl-lim",
                     '{"max-connections": 5, "max-queues": 1}')
    assert done.returncode == 0, done.stderr
    done = await ctl(mb, "list_vhost_limits", "-p", "ctl-lim")
    assert done.stdout.splitlines() == ['Listing limits for vhost "ctl-lim" ...',
                                        '{"max-connections":5,"max-queues":1}']
    conn = await aiormq.connect(f"amqp://guest:guest@127.0.0.1:{mb.port}/ctl-lim")
    ch = await conn.channel()
    await ch.queue_declare("one")
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await ch.queue_declare("two")
    # set_vhost_limits replaces the whole set, as rabbitmqctl's
    assert (await ctl(mb, "set_vhost_limits", "-p", "ctl-lim", '{"max-queues": 2}')
            ).returncode == 0
    assert mb.get("/api/vhost-limits/ctl-lim") == [{"vhost": "ctl-lim",
                                                    "value": {"max-queues": 2}}]
    ch = await conn.channel()
    await ch.queue_declare("two")
    done = await ctl(mb, "set_vhost_limits", "-p", "ctl-lim", '{"bogus": 1}')
    assert done.returncode == 65 and "Unrecognised terms" in done.stderr
    assert (await ctl(mb, "clear_vhost_limits", "-p", "ctl-lim")).returncode == 0
    assert mb.get("/api/vhost-limits/ctl-lim") == []
    await ch.queue_declare("three")
    await conn.close()
    assert (await ctl(mb, "delete_vhost", "ctl-lim")).returncode == 0


async def test_user_verbs(mb: MgmtBroker) -> None:
    assert (await ctl(mb, "add_user", "erin", "old")).returncode == 0
    done = await ctl(mb, "authenticate_user", "erin", "old")
    assert (done.returncode, done.stdout) == (
        0, 'Authenticating user "erin" ...\nSuccess\n')  # no tags: a login all the same
    done = await ctl(mb, "change_password", "erin", "new")
    assert (done.returncode, done.stdout) == (0, 'Changing password for user "erin" ...\n')
    done = await ctl(mb, "authenticate_user", "erin", "old")
    assert done.returncode == 65
    assert done.stderr == ('hare-ctl: failed to authenticate user "erin"\n'
                           "user 'erin' - invalid credentials\n")
    assert (await ctl(mb, "authenticate_user", "erin", "new")).returncode == 0
    done = await ctl(mb, "change_password", "nobody", "x")
    assert (done.returncode, done.stderr) == (65, "hare-ctl: not found: user 'nobody'\n")
    assert mb.api("GET", "/api/users/nobody")[0] == 404  # not created by the attempt

    assert (await ctl(mb, "set_permissions", "erin", "^c", "^w", "^r")).returncode == 0
    conn = await aiormq.connect(f"amqp://erin:new@127.0.0.1:{mb.port}/")  # the new password
    await conn.close()
    done = await ctl(mb, "list_user_permissions", "erin")
    assert done.stdout.splitlines()[1:] == ["vhost  configure  write  read",
                                            "/      ^c         ^w     ^r"]
    done = await ctl(mb, "clear_permissions", "erin")
    assert done.stdout == 'Clearing permissions for user "erin" in vhost "/" ...\n'
    assert json.loads((await ctl(mb, "--json", "list_user_permissions", "erin")).stdout) == []
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError,
                       match="access to vhost '/' refused for user 'erin'"):
        await asyncio.to_thread(pika.BlockingConnection, pika.URLParameters(
            f"amqp://erin:new@127.0.0.1:{mb.port}/"))
    assert (await ctl(mb, "clear_permissions", "erin")).returncode == 0  # nothing to clear
    done = await ctl(mb, "clear_permissions", "nobody")
    assert (done.returncode, done.stderr) == (65, "hare-ctl: not found: user 'nobody'\n")
    done = await ctl(mb, "clear_permissions", "-p", "no-vh", "erin")
    assert (done.returncode, done.stderr) == (65, "hare-ctl: not found: vhost 'no-vh'\n")
    assert (await ctl(mb, "delete_user", "erin")).returncode == 0


async def test_ping_and_alarms(mb: MgmtBroker, tmp_path: Path) -> None:
    done = await ctl(mb, "ping")
    assert done.returncode == 0 and done.stdout.endswith("Ping succeeded\n")
    nodes = {n["name"] for n in mb.get("/api/nodes")}  # at workers > 1, whichever answers
    done = await ctl(mb, "alarms")
    head, tail = done.stdout.splitlines()
    node = head.removeprefix("Asking node ").removesuffix(" to report any known resource "
                                                          "alarms ...")
    assert node in nodes and head != node
    assert tail == f"Node {node} reported no alarms, local or clusterwide"
    url = f"http://127.0.0.1:{free_port()}"
    assert (await asyncio.to_thread(run_ctl, "ping", url=url)).returncode == 69

    alarmed = MgmtBroker(tmp_path / "alarmed", ["--disk-free-limit", str(10**18)]).start()
    try:
        await alarmed.until("/api/nodes", lambda ns: ns[0]["disk_free_alarm"])
        # the answering node's own (a worker's, whichever answers, at workers > 1)
        nodes = {n["name"] for n in alarmed.get("/api/nodes")}
        done = await ctl(alarmed, "alarms")
        assert done.returncode == 0
        [line] = done.stdout.splitlines()[1:]
        assert line.startswith("Free disk space alarm on node ")
        assert line.rsplit(" ", 1)[1] in nodes
        [alarm] = json.loads((await ctl(alarmed, "--json", "alarms")).stdout)
        assert alarm["resource"] == "disk space" and alarm["node"] in nodes
    finally:
        alarmed.stop()


async def test_topic_permissions_user_limits_and_scope(mb: MgmtBroker) -> None:
    """rabbitmqctl's topic-permission and user-limit verbs, and a management user's scope."""
    user = "ctl-scoped"
    assert (await ctl(mb, "add_user", user, "pw", "--tags", "management")).returncode == 0
    assert (await ctl(mb, "set_permissions", user, "^app", "^app", "^app")).returncode == 0
    done = await ctl(mb, "set_topic_permissions", user, "amq.topic", "^a", "^b")
    assert done.returncode == 0, done.stderr
    done = await ctl(mb, "--json", "list_topic_permissions")
    assert {"user": user, "exchange": "amq.topic", "write": "^a", "read": "^b"} in json.loads(
        done.stdout)
    assert (await ctl(mb, "clear_topic_permissions", user, "amq.topic")).returncode == 0
    assert user not in (await ctl(mb, "list_topic_permissions")).stdout
    done = await ctl(mb, "set_user_limits", user, '{"max-connections": 3, "max-channels": 9}')
    assert done.returncode == 0, done.stderr
    done = await ctl(mb, "--json", "list_user_limits")
    assert {"user": user, "value": {"max-connections": 3, "max-channels": 9}} in json.loads(
        done.stdout)
    assert (await ctl(mb, "clear_user_limits", user, "all")).returncode == 0
    done = await ctl(mb, "set_user_limits", user, "not json")
    assert done.returncode == 65 and "not JSON" in done.stderr

    # the same scope as the API: the user's vhost only, no administration
    as_user = ("--user", user, "--password", "pw")
    done = await ctl(mb, *as_user, "list_vhosts")
    assert done.returncode == 0 and done.stdout.split() == ["name", "/"]
    done = await ctl(mb, *as_user, "list_users")
    assert done.returncode == 77
    assert done.stderr == f"hare-ctl: access refused for user '{user}': Not administrator user\n"
    done = await ctl(mb, *as_user, "status")  # no node figures for management users
    assert done.returncode == 0, done.stderr
    assert mb.api("PUT", "/api/queues/%2F/ctl.scope", {})[0] == 201
    done = await ctl(mb, *as_user, "purge_queue", "ctl.scope")
    assert done.returncode == 77 and "ACCESS_REFUSED - access to queue 'ctl.scope'" in done.stderr
    assert (await ctl(mb, "delete_user", user)).returncode == 0


async def test_shovel_verbs(mb: MgmtBroker) -> None:
    value = {"src-uri": "amqp://", "src-queue": "ctl.sv", "dest-uri": "amqp://",
             "dest-queue": "ctl.sv.dest"}
    status, _ = mb.api("PUT", "/api/parameters/shovel/%2F/ctl-sv", {"value": value})
    assert status == 201
    await mb.until("/api/shovels", lambda rows: [r["state"] for r in rows] == ["running"])
    lines = (await ctl(mb, "list_shovels")).stdout.splitlines()
    assert lines[0].split() == ["name", "vhost", "type", "state", "source", "destination",
                                "reason"]
    assert lines[1].split() == ["ctl-sv", "/", "dynamic", "running", "amqp://", "ctl.sv",
                                "amqp://", "ctl.sv.dest"]
    rows = json.loads((await ctl(mb, "--json", "shovel_status")).stdout)
    assert [(r["name"], r["state"]) for r in rows] == [("ctl-sv", "running")]
    done = await ctl(mb, "delete_shovel", "ctl-sv")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Deleting shovel ctl-sv in vhost /"
    assert mb.get("/api/shovels") == []
    done = await ctl(mb, "delete_shovel", "ctl-sv")
    assert done.returncode == 65
    assert done.stderr == "hare-ctl: not found: shovel 'ctl-sv' in vhost '/'\n"
