"""docker/compose.yaml and docker/hare.toml, checked without a Docker engine."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from broker.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")  # PyYAML: not a runtime dependency
    document = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(document, dict)
    return document


def interpolated(env: dict[str, Any]) -> dict[str, str]:
    # Compose's ${NAME:-default} with NAME unset.
    return {key: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value)) for key, value in env.items()}


def test_service_builds_from_the_dockerfile() -> None:
    service = compose()["services"]["hare"]
    context = (DOCKER / service["build"]["context"]).resolve()
    assert context == ROOT
    assert (context / service["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    assert service["init"] is True


def test_ports_volume_and_config_mount() -> None:
    document = compose()
    service = document["services"]["hare"]
    assert set(interpolated(dict(enumerate(service["ports"]))).values()) == {
        "5672:5672", "15672:15672"}
    assert interpolated({"image": service["image"]})["image"] == "hare:latest"
    assert "hare-data" in document["volumes"]
    assert "hare-data:/var/lib/hare" in service["volumes"]
    mounts = {volume.split(":")[1]: volume for volume in service["volumes"]}
    source, target, mode = mounts["/etc/hare/hare.toml"].split(":")
    assert (DOCKER / source).is_file() and mode == "ro"
    assert service["command"] == ["--config", target]


def test_compose_settings_load(tmp_path: Path) -> None:
    """The compose command and environment, with the mounted file, make a valid config."""
    service = compose()["services"]["hare"]
    env = interpolated(service["environment"])
    assert all(key.startswith("HARE_") for key in env)
    argv = [
        str(DOCKER / "hare.toml") if arg == "/etc/hare/hare.toml" else arg
        for arg in service["command"]
    ]
    settings = load_settings(argv, {**env, "HARE_DATA_DIR": "/var/lib/hare"})
    assert settings.port == 5672 and settings.management_port == 15672
    assert settings.default_user == "admin" and settings.default_pass == "change-me"
    assert settings.node_name == "hare@hare"  # not hare@<container id>: kept on re-creation
    assert settings.vm_memory_high_watermark.relative == 0.6
    assert str(settings.data_dir) == "/var/lib/hare"


def test_docker_hare_toml_loads_alone() -> None:
    settings = load_settings(["--config", str(DOCKER / "hare.toml")], {})
    assert settings.host == "" and settings.port == 5672


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_accepts_the_file() -> None:
    done = subprocess.run(
        ["docker-compose", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_cluster_compose_nodes_load(tmp_path: Path) -> None:
    """docker/compose.cluster.yaml: etcd plus three nodes, each its own name and volume, and
    every node's environment a valid cluster configuration."""
    yaml = pytest.importorskip("yaml")
    document = yaml.safe_load((DOCKER / "compose.cluster.yaml").read_text())
    services = document["services"]
    assert (DOCKER / services["etcd"]["build"]["dockerfile"]).is_file()
    nodes = [name for name in services if name.startswith("hare-")]
    assert len(nodes) == 3
    names, volumes = set(), set()
    for name in nodes:
        service = services[name]
        env = interpolated(service["environment"])
        settings = load_settings([], {**env, "HARE_DATA_DIR": str(tmp_path)})
        assert settings.cluster_etcd == "http://etcd:2379" and settings.cluster_secret
        names.add(settings.node_name)
        volumes.update(v.split(":")[0] for v in service["volumes"])
        assert service["hostname"] == name
    assert len(names) == 3 and len(volumes) == 3 and volumes <= set(document["volumes"])
