"""Podman and podman-compose for the container tests: the image built from docker/Dockerfile,
containers and compose projects under names of their own (several test sessions share one
machine's podman), waits on conditions with deadlines that fail fast, and the pika and aio-pika
calls the tests make through the published ports.

Podman runs health checks from systemd timers; where systemd is not running (CI), nothing runs
them on a schedule, so the tests run them with `podman healthcheck run`, the same check
(the image's HEALTHCHECK) that a timer would run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aio_pika
import pika
import yaml

from tests.mgmt.helpers import api_request, free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
BASE_IMAGE = "docker.io/library/python:3.11-slim"
BASE_SCRIPT = DOCKER / "debian-base-images.sh"

# Generous for a loaded machine, short enough that a broker that will never answer fails the
# test in well under a minute.
START_S = 60.0
BUILD_S = 900.0

T = TypeVar("T")


def unusable() -> str | None:
    """Why podman cannot run containers on this machine, or None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (.ci/run installs podman, runc and podman-compose)"
    done = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"podman cannot run here: {done.stderr.strip()[-500:]}"
    return None


def compose_unusable() -> str | None:
    """Why podman-compose cannot run the compose files here, or None when it can."""
    if shutil.which("podman-compose") is None:
        return "podman-compose is not installed (.ci/run installs it)"
    return None


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run(argv: list[str], timeout: float = 120.0, check: bool = True,
        env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-2000:]}\n"
            f"{done.stderr[-3000:]}")
    return done


def podman(*args: str, timeout: float = 120.0, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    return run(["podman", *args], timeout=timeout, check=check)


def wait_for(what: str, check: Callable[[], T], timeout: float = START_S,
             interval: float = 0.25) -> T:
    """Call `check` until it returns something true and return that; fail with what it last
    returned or raised once `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        last: object
        try:
            last = value = check()
            if value:
                return value
        except Exception as exc:  # not ready yet: connection refused, a 503, ...
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s; last: {last!r}")
        time.sleep(interval)


def ensure_base_image() -> None:
    """The stand-in for python:3.11-slim where debootstrap can make it; else `podman build`
    pulls the real one (where a registry is reachable)."""
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    if shutil.which("debootstrap") is not None:
        run([str(BASE_SCRIPT), "podman"], timeout=BUILD_S)


def build_image(context: Path, tag: str) -> str:
    """`podman build --format docker` (the OCI format drops HEALTHCHECK) of context's
    docker/Dockerfile; returns the image id. Layers are cached between builds."""
    ensure_base_image()
    run(["podman", "build", "--format", "docker", "-f", str(context / "docker" / "Dockerfile"),
         "-t", tag, str(context)], timeout=BUILD_S)
    return podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def inspect(name: str) -> dict[str, Any]:
    (found,) = json.loads(podman("inspect", name).stdout)
    return dict(found)


def logs(name: str) -> str:
    done = podman("logs", name, check=False)
    return done.stdout + done.stderr


def json_events(text: str) -> list[dict[str, Any]]:
    """The broker's JSON log lines (podman's own lines and the listening banners skipped)."""
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


@dataclass
class Broker:
    """A Hare in a container, reached through published ports on 127.0.0.1."""

    container: str
    user: str
    password: str
    amqp_port: int = field(default_factory=free_port)
    mgmt_port: int = field(default_factory=free_port)

    def url(self, vhost: str = "%2F", user: str | None = None,
            password: str | None = None) -> str:
        return (f"amqp://{user or self.user}:{password or self.password}"
                f"@127.0.0.1:{self.amqp_port}/{vhost}")

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return api_request(f"http://127.0.0.1:{self.mgmt_port}", method, path, body,
                           user=self.user, password=self.password, timeout=5.0)

    def get(self, path: str) -> Any:
        status, body = self.api("GET", path)
        assert status == 200, (path, status, body)
        return body

    def wait_serving(self) -> dict[str, Any]:
        """Until the management API answers for the node (every listener is bound before any
        serves, so AMQP is up too); returns the first /api/nodes entry (a single node's own)."""
        def node() -> dict[str, Any] | None:
            status, body = self.api("GET", "/api/nodes")
            return body[0] if status == 200 and body else None

        try:
            return wait_for(f"{self.container} serving", node)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs(self.container)[-3000:]}") from None

    def health(self) -> tuple[int, str]:
        """Run the image's HEALTHCHECK now; (its exit code, the health status after it)."""
        done = podman("healthcheck", "run", self.container, check=False, timeout=30)
        state = inspect(self.container)["State"]
        return done.returncode, str(state.get("Health", state.get("Healthcheck", {}))["Status"])

    def broker_pid(self) -> int:
        """hare-server's pid inside the container, as its own API reports it."""
        return int(self.get("/api/nodes")[0]["os_pid"])


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
    """docker/compose.yaml's stop_grace_period, in seconds."""
    grace = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["hare"]["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", grace)
    assert match, grace
    return int(match.group(1))


def assert_stopped_cleanly(broker: Broker, stops: int) -> None:
    """Exit code 0 (not 137: SIGKILL after the grace period), the broker's own last line, and
    in each of the `stops` runs every node that started (the one process, or each worker of
    the image's default, a worker per CPU) logged its stop."""
    state = inspect(broker.container)["State"]
    assert state["Running"] is False and state["ExitCode"] == 0, state
    lines = json_events(logs(broker.container))
    events = [line["event"] for line in lines]
    # whole lines: what came after, and why (a worker still starting when the stop came ends
    # its start instead: the management API answers once the first worker serves)
    assert events[-1] in ("broker stopped", "shutdown requested while starting"), lines[-5:]
    stopped = events.count("broker stopped")
    assert stopped == events.count("broker started") and stopped >= stops, events


class ComposeProject:
    """A project of a compose file run by podman-compose under a name of its own, every Hare
    service on free host ports (HARE_COMPOSE_AMQP_PORT<suffix> and _MANAGEMENT_PORT<suffix>)
    with a password of its own. `project(*args)` runs `podman-compose -f FILE -p NAME ARGS`."""

    def __init__(self, file: Path, env: dict[str, str], services: dict[str, str]) -> None:
        """`services`: each Hare service and the suffix of its port variables."""
        self.file = file
        self.name = unique("hare-test")
        self.password = uuid.uuid4().hex
        self.brokers = {
            service: Broker(container=self.container(service), user="admin",
                            password=self.password)
            for service in services}
        self.env = {**env, "HARE_DEFAULT_PASS": self.password}
        for service, suffix in services.items():
            self.env[f"HARE_COMPOSE_AMQP_PORT{suffix}"] = str(self.brokers[service].amqp_port)
            self.env[f"HARE_COMPOSE_MANAGEMENT_PORT{suffix}"] = str(
                self.brokers[service].mgmt_port)

    def container(self, service: str) -> str:
        return f"{self.name}_{service}_1"

    def volume(self, name: str) -> str:
        return f"{self.name}_{name}"

    def __call__(self, *args: str, timeout: float = 180.0, **env: str) -> str:
        done = run(["podman-compose", "-f", str(self.file), "-p", self.name, *args],
                   timeout=timeout, env={**os.environ, **self.env, **env})
        return done.stdout + done.stderr

    def down(self) -> None:
        """Containers, volumes and network gone. podman-compose 1.0.3 leaves the network, and
        the volumes it did not create itself (a test's `podman run -v` made them first)."""
        try:
            self("down", "-v")
        finally:
            podman("network", "rm", "-f", f"{self.name}_default", check=False)
            volumes = podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
            for volume in volumes:
                if volume.startswith(f"{self.name}_"):
                    podman("volume", "rm", "-f", volume, check=False)


@contextmanager
def compose_project(image: str) -> Iterator[tuple[Broker, ComposeProject]]:
    """docker/compose.yaml on `image`; yields its broker and the project, taken down with its
    volume at the end."""
    project = ComposeProject(COMPOSE_FILE, {"HARE_COMPOSE_IMAGE": image}, {"hare": ""})
    try:
        yield project.brokers["hare"], project
    finally:
        project.down()
