"""The image with HARE_WORKERS=auto: one worker per CPU the container is given (its cgroup
quota, not the host's cores), behind the one published port."""

from __future__ import annotations

import uuid

import pytest

from tests.docker.podman import Broker, podman, unique, wait_for

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("cpus", ["2", "1"])
def test_auto_workers_follow_the_cpu_limit(image: str, cpus: str) -> None:
    broker = Broker(container=unique("hare-test"), user="admin", password=uuid.uuid4().hex)
    podman("run", "-d", "--name", broker.container, "--init", "--cpus", cpus,
           "-p", f"127.0.0.1:{broker.amqp_port}:5672",
           "-p", f"127.0.0.1:{broker.mgmt_port}:15672",
           "-e", "HARE_DEFAULT_USER=admin", "-e", f"HARE_DEFAULT_PASS={broker.password}",
           "-e", "HARE_WORKERS=auto", image)
    try:
        broker.wait_serving()
        names = wait_for("every worker a node", lambda: (
            names if len(names := [n["name"] for n in broker.get("/api/nodes")
                                   if n.get("running")]) == int(cpus) else None))
        if cpus == "1":  # one CPU: the single process, no parent and no worker names
            assert not names[0].endswith("-w1"), names
        else:
            assert sorted(n.rsplit("-", 1)[1] for n in names) == ["w1", "w2"], names
    finally:
        podman("rm", "-f", "-v", broker.container, check=False)
