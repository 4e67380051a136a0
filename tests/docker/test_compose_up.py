"""docker/compose.yaml run for real by podman-compose, with pika and aio-pika through the
published ports: messages survive a restart and an upgrade of the image, and a stop is the
broker's own clean shutdown."""

from __future__ import annotations

import asyncio

import pika
import pytest

from tests.docker.podman import (
    Broker,
    assert_stopped_cleanly,
    compose_project,
    drain,
    inspect,
    podman,
    publish_with_aio_pika,
    publish_with_pika,
    stop_grace_s,
)

# the first test sets up the session's image build; podman-compose runs the files
pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("compose_ready")]

QUEUE = "deploy-durable"


def test_compose_messages_survive_restart_and_stop_is_clean(image: str) -> None:
    with compose_project(image) as (broker, compose):
        compose("up", "-d")
        # the compose file names the node: the same name whatever the container's id (the
        # server's: with a worker per CPU each worker's node is hare@hare-w<i>)
        assert broker.wait_serving()["server"] == "hare@hare"
        from_pika = [b"pika %d" % n for n in range(50)]
        from_aio_pika = [b"aio-pika %d" % n for n in range(50)]
        publish_with_pika(broker.url(), "", QUEUE, from_pika)  # the compose file's user
        asyncio.run(publish_with_aio_pika(broker.url(), QUEUE, from_aio_pika))

        compose("restart")
        broker.wait_serving()
        assert asyncio.run(drain(broker.url(), QUEUE)) == from_pika + from_aio_pika

        # podman-compose passes no stop_grace_period to podman: -t gives it, as docker
        # compose would take it from the file
        compose("stop", "-t", str(stop_grace_s()))
        assert_stopped_cleanly(broker, stops=2)


def test_volume_from_the_older_image_is_recovered(image: str, older_image: str) -> None:
    """Definitions and messages that the older image wrote on a volume, read by this one when
    compose runs it on that volume. The older image runs alone (`podman run`): this compose
    file sets HARE_NODE_NAME, a setting it did not know."""
    vhost, user, password = "upgrade", "app", "app-secret"
    bodies = [b"order %d" % n for n in range(20)]
    with compose_project(image) as (broker, compose):
        older = Broker(container=f"{compose.name}-older", user="admin",
                       password=broker.password)
        podman("run", "-d", "--name", older.container, "--init",
               "-v", f"{compose.volume('hare-data')}:/var/lib/hare",
               "-p", f"127.0.0.1:{older.amqp_port}:5672",
               "-p", f"127.0.0.1:{older.mgmt_port}:15672",
               "-e", "HARE_DEFAULT_USER=admin", "-e", f"HARE_DEFAULT_PASS={older.password}",
               older_image)
        try:
            older.wait_serving()
            assert older.api("PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
            assert older.api("PUT", f"/api/users/{user}", {"password": password, "tags": ""}
                             )[0] in (201, 204)
            assert older.api("PUT", f"/api/permissions/{vhost}/{user}",
                             {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
            url = older.url(vhost, user, password)
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.exchange_declare("orders", "topic", durable=True)
            channel.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 1000})
            channel.queue_bind("orders.eu", "orders", "eu.#")
            connection.close()
            publish_with_pika(url, "orders", "eu.paris", bodies)
            podman("stop", "-t", str(stop_grace_s()), older.container)
            assert_stopped_cleanly(older, stops=1)
        finally:
            podman("rm", "-f", older.container, check=False)

        compose("up", "-d")
        broker.wait_serving()
        assert inspect(broker.container)["ImageName"] == image

        # the user, its password and permissions, the exchange, the binding: a new message
        # routes, mandatory and confirmed, into the old queue behind the old messages
        url = broker.url(vhost, user, password)
        publish_with_pika(url, "orders", "eu.lyon", [b"after the upgrade"])
        assert asyncio.run(drain(url, "orders.eu")) == [*bodies, b"after the upgrade"]
        queue = broker.get(f"/api/queues/{vhost}/orders.eu")
        assert queue["durable"] is True and queue["arguments"] == {"x-max-length": 1000}
        exchange = broker.get(f"/api/exchanges/{vhost}/orders")
        assert exchange["type"] == "topic" and exchange["durable"] is True
