"""Podman and podman-compose for the container tests: the image built from docker/Dockerfile,
containers and compose projects under names of their own (several test sessions share one
machine's podman), and waits on conditions with deadlines that fail fast.

Podman runs health checks from systemd timers; where systemd is not running (CI), nothing runs
them on a schedule, so the tests run them with `podman healthcheck run`, the same check
(the image's HEALTHCHECK) that a timer would run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
    if shutil.which("podman-compose") is None:
        return "podman-compose is not installed (.ci/run installs it)"
    done = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"podman cannot run here: {done.stderr.strip()[-500:]}"
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
        serves, so AMQP is up too); returns the node's /api/nodes entry."""
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


@contextmanager
def compose_project(image: str) -> Iterator[tuple[Broker, Callable[..., str]]]:
    """A project of docker/compose.yaml run by podman-compose on `image`, with free host ports
    and a password of its own; yields the broker and `compose(*args, image=...)`, which runs
    `podman-compose -f docker/compose.yaml -p NAME ARGS`. Taken down with its volume at the
    end (podman-compose leaves the project's network: removed here too)."""
    project = unique("hare-test")
    broker = Broker(container=f"{project}_hare_1", user="admin", password=uuid.uuid4().hex)

    def compose(*args: str, image: str = image, timeout: float = 180.0) -> str:
        env = {
            **os.environ,
            "HARE_COMPOSE_IMAGE": image,
            "HARE_COMPOSE_AMQP_PORT": str(broker.amqp_port),
            "HARE_COMPOSE_MANAGEMENT_PORT": str(broker.mgmt_port),
            "HARE_DEFAULT_PASS": broker.password,
        }
        done = run(["podman-compose", "-f", str(COMPOSE_FILE), "-p", project, *args],
                   timeout=timeout, env=env)
        return done.stdout + done.stderr

    try:
        yield broker, compose
    finally:
        try:
            compose("down", "-v")
        finally:
            podman("network", "rm", "-f", f"{project}_default", check=False)
