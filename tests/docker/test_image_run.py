"""The image built from docker/Dockerfile and run by podman as `docker run` would run it: what
it holds, who runs the broker, the memory limit it honours and its health check."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from tests.docker.podman import BASE_IMAGE, Broker, inspect, podman, unique, wait_for

# The first test sets up the session's image build (minutes on a fresh machine, seconds from
# the layer cache); every wait inside has its own deadline.
pytestmark = pytest.mark.timeout(900)

MEMORY_BYTES = 256 * 2**20
# What the image may add to its base: the broker and its dependencies are about 33 MB; the test
# and Spark extras (pytest, pyspark, pandas, pyarrow) would be hundreds.
ADDED_BYTES_MAX = 64 * 2**20


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[Broker]:
    """One container of the image, with a memory limit and the watermark at half of it."""
    broker = Broker(container=unique("hare-test"), user="admin", password=uuid.uuid4().hex)
    podman("run", "-d", "--name", broker.container, "--init", "--memory", "256m",
           "-p", f"127.0.0.1:{broker.amqp_port}:5672",
           "-p", f"127.0.0.1:{broker.mgmt_port}:15672",
           "-e", "HARE_DEFAULT_USER=admin", "-e", f"HARE_DEFAULT_PASS={broker.password}",
           "-e", "HARE_VM_MEMORY_HIGH_WATERMARK=0.5",
           # one process (the image's default, auto, is a worker per CPU: there the watermark
           # is split between the workers, and a stopped parent is not a wedged broker, its
           # workers answer; tests/docker/test_image_workers.py runs auto)
           "-e", "HARE_WORKERS=1", image)
    try:
        yield broker
    finally:
        podman("rm", "-f", "-v", broker.container, check=False)


def test_image_config_keeps_user_volume_and_healthcheck(image: str) -> None:
    (config,) = json.loads(podman("image", "inspect", image).stdout)
    settings = config["Config"]
    assert settings["User"] == "hare"
    assert settings["Entrypoint"] == ["hare-server"]
    assert "/var/lib/hare" in settings["Volumes"]
    assert {"5672/tcp", "15672/tcp"} <= set(settings["ExposedPorts"])
    # kept by --format docker; the OCI format would have dropped it
    assert config["Healthcheck"]["Test"] == ["CMD", "hare-healthcheck"]
    base = int(podman("image", "inspect", "--format", "{{.Size}}", BASE_IMAGE).stdout)
    assert int(config["Size"]) - base < ADDED_BYTES_MAX, (config["Size"], base)


def test_image_holds_no_sources_or_build_tools(image: str) -> None:
    # aio_pika is not in the list: the shovel plugin runs on it, so the image needs it
    probe = (
        "import importlib.util, json, os, shutil\n"
        "print(json.dumps({\n"
        "  'modules': [m for m in ('pip', 'setuptools', 'pytest', 'pyspark', 'pika',"
        " 'hypothesis') if importlib.util.find_spec(m)],\n"
        "  'tools': [t for t in ('gcc', 'cc', 'c++', 'make', 'git') if shutil.which(t)],\n"
        "  'paths': [p for p in ('/src', '/opt/hare/tests', '/opt/hare/docs')"
        " if os.path.exists(p)],\n"
        "  'broker': importlib.util.find_spec('broker').origin,\n"
        "  'packages': [m for m in ('hare_perf', 'hare_bench') if importlib.util.find_spec(m)],\n"
        "  'scripts': sorted(s for s in os.listdir('/opt/hare/bin') if s.startswith('hare')),\n"
        "}))\n"
    )
    done = podman("run", "--rm", "--entrypoint", "python", image, "-c", probe)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["modules"] == [] and found["tools"] == [] and found["paths"] == [], found
    assert found["broker"].startswith("/opt/hare/lib/"), found
    # the broker's commands only: no load generator, and no entry point left without its module
    assert found["packages"] == [] and found["scripts"] == ["hare-ctl", "hare-server"], found


def test_broker_runs_as_hare(container: Broker) -> None:
    container.wait_serving()
    table = podman("top", container.container, "user", "args").stdout.splitlines()
    processes = [line.split(None, 1) for line in table[1:] if line.strip()]
    assert any("hare-server" in args for _, args in processes), table
    assert {user for user, _ in processes} == {"hare"}, table


def test_memory_limit_sets_the_watermark(container: Broker) -> None:
    """--memory 256m and a watermark of 0.5: the alarm limit is half the cgroup's limit, not
    half of the host's memory."""
    node = container.wait_serving()
    assert node["mem_limit"] == MEMORY_BYTES // 2, node


def test_healthcheck_healthy_serving_unhealthy_wedged(container: Broker) -> None:
    container.wait_serving()
    wait_for("healthy while serving", lambda: container.health() == (0, "healthy"))
    pid = container.broker_pid()
    # Wedged: the kernel still accepts connections on the listening socket, nothing answers.
    podman("exec", container.container, "sh", "-c", f"kill -STOP {pid}")
    try:
        # the image's --retries=3 failures in a row, once past its --start-period
        wait_for("unhealthy while wedged", lambda: container.health()[1] == "unhealthy",
                 timeout=120)
        code, _ = container.health()
        assert code == 1
    finally:
        podman("exec", container.container, "sh", "-c", f"kill -CONT {pid}")
    wait_for("healthy again", lambda: container.health() == (0, "healthy"))
    assert inspect(container.container)["State"]["Running"] is True
