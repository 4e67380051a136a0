"""A stream queue in a cluster: it lives on its home node; a publish on another node reaches
it, confirmed once the home node has it on disk; consumers on another node read it over the
link from their own x-stream-offset (the consume's argument crosses the link), each with its
own credit, even two of one channel at the same offsets; what a stream refuses is refused
on the far node as at home."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from .helpers import ClusterNode, EtcdProc, wait_for


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProc
         ) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    root = tmp_path_factory.mktemp("stream")
    nodes = [ClusterNode(root / n, etcd, "stream", f"stream-{n}").start() for n in "ab"]
    for node in nodes:
        wait_for(lambda n=node: len([x for x in n.get("/api/nodes") if x["running"]]) == 2,
                 what="two nodes")
    yield nodes[0], nodes[1]
    for node in nodes:
        node.stop()


def test_stream_homed_on_b_read_from_a(pair: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = pair
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().queue_declare("cs", durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    wait_for(lambda: a.api("GET", "/api/queues/%2F/cs")[0] == 200, what="cs on a")
    assert a.get("/api/queues/%2F/cs")["node"] == "stream-b"

    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(30):
        ch.basic_publish("", "cs", b"m%d" % i)  # confirmed by b, once on its disk
    info = b.get("/api/queues/%2F/cs")
    assert (info["type"], info["first_offset"], info["last_offset"]) == ("stream", 0, 29)

    # two consumers of one channel on a, from offsets of their own, each with its prefetch
    ch.basic_qos(prefetch_count=4)
    got: dict[str, list[tuple[int, int]]] = {"x": [], "y": []}

    def on(tag: str):
        return lambda c, m, p, body: got[tag].append((p.headers["x-stream-offset"],
                                                      m.delivery_tag))

    ch.basic_consume("cs", on("x"), consumer_tag="x", arguments={"x-stream-offset": "first"})
    ch.basic_consume("cs", on("y"), consumer_tag="y", arguments={"x-stream-offset": 2})

    def pump(want_x: int, want_y: int) -> None:
        def done() -> bool:
            conn.process_data_events(time_limit=0.05)
            return len(got["x"]) >= want_x and len(got["y"]) >= want_y
        wait_for(done, what=f"x {want_x}, y {want_y}")
        conn.process_data_events(time_limit=0.2)  # and no more than the prefetch allows
        assert (len(got["x"]), len(got["y"])) == (want_x, want_y)

    pump(4, 4)
    assert [o for o, _ in got["x"]] == [0, 1, 2, 3]
    assert [o for o, _ in got["y"]] == [2, 3, 4, 5]
    # y's acks give y its credit back, not x's (the same offsets in flight on one link)
    for _, tag in got["y"]:
        ch.basic_ack(tag)
    pump(4, 8)
    for _, tag in got["x"]:
        ch.basic_ack(tag)
    pump(8, 8)
    assert [o for o, _ in got["x"]] == list(range(8))
    assert [o for o, _ in got["y"]] == list(range(2, 10))
    conn.close()

    # what a stream refuses, refused on the far node
    for action, text in ((lambda c: c.basic_get("cs"), "basic.get not supported"),
                         (lambda c: c.queue_purge("cs"), "queue.purge not supported")):
        conn = pika.BlockingConnection(pika.URLParameters(a.url))
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker, match=text):
            action(conn.channel())
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="prefetch count is not set"):
        conn.channel().basic_consume("cs", print)
    conn.close()
    # and the home node still holds all, serving a new reader from the first offset
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    ch = conn.channel()
    ok = ch.queue_declare("cs", passive=True).method
    assert ok.message_count == 30
    conn.close()
