"""docker/compose.yaml run for real by podman-compose, with pika and aio-pika through the
published ports: messages survive a restart and an upgrade of the image, and a stop is the
broker's own clean shutdown."""

from __future__ import annotations

import asyncio
import re

import aio_pika
import pika
import pytest
import yaml

from tests.docker.podman import (
    COMPOSE_FILE,
    Broker,
    compose_project,
    inspect,
    json_events,
    logs,
)

pytestmark = pytest.mark.timeout(900)  # the first test sets up the session's image build

QUEUE = "deploy-durable"


def publish_with_pika(url: str, exchange: str, key: str, bodies: list[bytes]) -> None:
    """Persistent messages with publisher confirms and mandatory: pika raises on a nack or a
    return, so each one is on disk and routed when this returns."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        if not exchange:
            channel.queue_declare(key, durable=True)
        for body in bodies:
            channel.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=2),
                                  mandatory=True)
    finally:
        connection.close()


async def publish_with_aio_pika(url: str, queue: str, bodies: list[bytes]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for body in bodies:  # each publish awaits its confirm
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue, mandatory=True)


async def drain(url: str, queue: str) -> list[bytes]:
    """Every message of an existing queue, in order, acked."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        bodies = []
        while (message := await declared.get(no_ack=False, fail=False)) is not None:
            bodies.append(message.body)
            await message.ack()
        return bodies


def stop_grace_s() -> int:
    grace = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["hare"]["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", grace)
    assert match, grace
    return int(match.group(1))


def assert_stopped_cleanly(broker: Broker, stops: int) -> None:
    """Exit code 0 (not 137: SIGKILL after the grace period) and the broker's own last line."""
    state = inspect(broker.container)["State"]
    assert state["Running"] is False and state["ExitCode"] == 0, state
    events = [event["event"] for event in json_events(logs(broker.container))]
    assert events[-1] == "broker stopped", events[-5:]
    assert events.count("broker stopped") == stops, events


def test_compose_messages_survive_restart_and_stop_is_clean(image: str) -> None:
    with compose_project(image) as (broker, compose):
        compose("up", "-d")
        broker.wait_serving()
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
    """Definitions and messages written by the older image on the project's volume, read by
    this one after `down` and `up` with the new image (the volume kept, the container new)."""
    vhost, user, password = "upgrade", "app", "app-secret"
    bodies = [b"order %d" % n for n in range(20)]
    with compose_project(older_image) as (broker, compose):
        compose("up", "-d")
        broker.wait_serving()
        assert inspect(broker.container)["ImageName"] == older_image
        assert broker.api("PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
        assert broker.api("PUT", f"/api/users/{user}", {"password": password, "tags": ""}
                          )[0] in (201, 204)
        assert broker.api("PUT", f"/api/permissions/{vhost}/{user}",
                          {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
        url = broker.url(vhost, user, password)
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.exchange_declare("orders", "topic", durable=True)
        channel.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 1000})
        channel.queue_bind("orders.eu", "orders", "eu.#")
        connection.close()
        publish_with_pika(url, "orders", "eu.paris", bodies)

        compose("down")
        compose("up", "-d", image=image)
        broker.wait_serving()
        assert inspect(broker.container)["ImageName"] == image

        # the user, its password and permissions, the exchange, the binding: a new message
        # routes, mandatory and confirmed, into the old queue behind the old messages
        publish_with_pika(url, "orders", "eu.lyon", [b"after the upgrade"])
        assert asyncio.run(drain(url, "orders.eu")) == [*bodies, b"after the upgrade"]
        queue = broker.get(f"/api/queues/{vhost}/orders.eu")
        assert queue["durable"] is True and queue["arguments"] == {"x-max-length": 1000}
        exchange = broker.get(f"/api/exchanges/{vhost}/orders")
        assert exchange["type"] == "topic" and exchange["durable"] is True
