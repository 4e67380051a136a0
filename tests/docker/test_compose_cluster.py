"""docker/compose.cluster.yaml run for real by podman-compose: etcd and three Hare nodes. A
queue lives on the node that declared it; clients of any node use it; when its node's
container stops, the queue answers "down or inaccessible" on the others and is never
re-created empty; when the container starts again, its messages are back (docs/CLUSTER.md)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from tests.docker.podman import (
    DOCKER,
    Broker,
    ComposeProject,
    assert_stopped_cleanly,
    drain,
    podman,
    publish_with_pika,
    run,
    stop_grace_s,
    wait_for,
)

# the first test sets up the session's image build; podman-compose runs the files
pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("compose_ready")]

CLUSTER_FILE = DOCKER / "compose.cluster.yaml"
NODES = {"hare-1": "_1", "hare-2": "_2", "hare-3": "_3"}  # service: its port variables' suffix
QUEUE = "cluster-durable"
DOWN = (f"home node 'hare@hare-1' of durable queue '{QUEUE}' in vhost '/' is down or "
        "inaccessible")


@pytest.fixture(scope="session")
def etcd_image(podman_ready: None) -> str:
    """docker/Dockerfile.etcd (Debian's etcd-server on debian:bookworm-slim), built once per
    machine for each version of the file and kept."""
    dockerfile = DOCKER / "Dockerfile.etcd"
    tag = f"localhost/hare-test-etcd:{hashlib.sha256(dockerfile.read_bytes()).hexdigest()[:12]}"
    if podman("image", "exists", tag, check=False).returncode != 0:
        run(["podman", "build", "-f", str(dockerfile), "-t", tag, str(DOCKER)], timeout=900)
    return tag


@pytest.fixture
def cluster(image: str, etcd_image: str) -> Iterator[ComposeProject]:
    project = ComposeProject(
        CLUSTER_FILE,
        {"HARE_COMPOSE_IMAGE": image, "HARE_COMPOSE_ETCD_IMAGE": etcd_image,
         "HARE_CLUSTER_SECRET": uuid.uuid4().hex},
        NODES)
    try:
        yield project
    finally:
        project.down()


def running_nodes(broker: Broker) -> list[str]:
    return sorted(node["name"] for node in broker.get("/api/nodes") if node["running"])


def declare(url: str, *, passive: bool) -> int:
    """queue.declare of QUEUE through one node: its message count, or the channel's close."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        frame = connection.channel().queue_declare(QUEUE, durable=True, passive=passive)
        return int(frame.method.message_count)
    finally:
        if connection.is_open:
            connection.close()


def get_acked(url: str, count: int) -> list[bytes]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        bodies = []
        for _ in range(count):
            method, _, body = channel.basic_get(QUEUE)
            assert method is not None, f"{len(bodies)} of {count}"
            channel.basic_ack(method.delivery_tag)
            bodies.append(body)
        return bodies
    finally:
        connection.close()


def test_a_queue_served_by_every_node_and_kept_by_its_own(cluster: ComposeProject) -> None:
    cluster("up", "-d")
    one, two, three = (cluster.brokers[service] for service in NODES)
    for broker in (one, two, three):
        broker.wait_serving()
    names = ["hare@hare-1", "hare@hare-2", "hare@hare-3"]
    wait_for("three nodes running", lambda: running_nodes(three) == names)

    bodies = [b"cluster %d" % n for n in range(20)]
    publish_with_pika(one.url(), "", QUEUE, bodies)  # declared on hare-1: its home node
    assert one.get(f"/api/queues/%2F/{QUEUE}")["node"] == "hare@hare-1"
    assert get_acked(two.url(), 10) == bodies[:10]  # through another node's link
    wait_for("the acks on the home node",
             lambda: one.get(f"/api/queues/%2F/{QUEUE}")["messages"] == 10)

    cluster("stop", "-t", str(stop_grace_s()), "hare-1")
    assert_stopped_cleanly(one, stops=1)
    wait_for("hare-1 down for hare-2", lambda: "hare@hare-1" not in running_nodes(two))
    for passive in (True, False):  # never re-created empty on another node
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            declare(two.url(), passive=passive)
        assert closed.value.reply_code == 404 and DOWN in closed.value.reply_text
    assert two.get(f"/api/queues/%2F/{QUEUE}")["state"] == "down"

    cluster("start", "hare-1")
    one.wait_serving()
    # declare-ok through another node counts what the home node holds
    wait_for("the queue back on hare-3", lambda: declare(three.url(), passive=True) == 10)
    assert asyncio.run(drain(three.url(), QUEUE)) == bodies[10:]
