"""docker/Dockerfile, checked without a Docker engine: what it names must exist."""

from __future__ import annotations

import importlib.util
import json
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        joined.append(pending + stripped)
        pending = ""
    assert not pending, "Dockerfile ends inside a continuation"
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in joined]


def args_of(name: str) -> list[str]:
    return [args for instruction, args in instructions() if instruction == name]


def exec_form(args: str) -> list[str]:
    parsed = json.loads(args)  # exec form: signals go to the process, not to a shell
    assert isinstance(parsed, list)
    return parsed


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of the COPY instructions from the build context (not the
    `COPY --from=build` between stages)."""
    found = []
    for args in args_of("COPY"):
        words = shlex.split(args)
        if any(word.startswith("--from=") for word in words):
            continue
        words = [word for word in words if not word.startswith("--")]
        found.append((words[:-1], words[-1]))
    return found


def test_base_user_volume_ports() -> None:
    # a build stage and the image, both on the same base
    assert args_of("FROM") == ["python:3.11-slim AS build", "python:3.11-slim"]
    assert "COPY --from=build /opt/hare /opt/hare" in [f"COPY {a}" for a in args_of("COPY")]
    assert args_of("VOLUME") == ["/var/lib/hare"]
    assert args_of("EXPOSE") == ["5672 15672"]
    assert args_of("USER") == ["hare"]
    assert any("useradd" in run and " hare" in run for run in args_of("RUN"))
    assert any("chown hare:hare /var/lib/hare" in run for run in args_of("RUN"))
    env = " ".join(args_of("ENV")).split()
    assert "HARE_DATA_DIR=/var/lib/hare" in env


def test_package_installed_with_pip_from_the_repo() -> None:
    assert any("/opt/hare/bin/pip install --no-deps ." in run for run in args_of("RUN"))
    sources = [source for sources, _ in copies() for source in sources]
    assert "pyproject.toml" in sources and "broker" in sources


def test_copied_files_exist_and_pass_the_dockerignore() -> None:
    ignore = (ROOT / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    for sources, _ in copies():
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the build context"
            assert f"!{source}" in ignore or f"!{source}/" in ignore, source


def test_entrypoint_is_the_hare_server_console_script() -> None:
    (entrypoint,) = args_of("ENTRYPOINT")
    assert exec_form(entrypoint) == ["hare-server"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["hare-server"].partition(":")
    assert importlib.util.find_spec(module) is not None, scripts["hare-server"]
    assert function == "main"


def test_healthcheck_runs_the_copied_script() -> None:
    (healthcheck,) = args_of("HEALTHCHECK")
    options, _, command = healthcheck.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    (program,) = exec_form(command)
    destinations = {dest: sources for sources, dest in copies()}
    assert destinations[f"/usr/local/bin/{program}"] == ["docker/healthcheck.py"]
    assert any(f"chmod 0755 /usr/local/bin/{program}" in run for run in args_of("RUN"))
    assert (ROOT / "docker" / "healthcheck.py").read_text().startswith("#!/usr/bin/env python3")


@pytest.mark.parametrize("name", ["CMD", "STOPSIGNAL"])
def test_exec_form_and_signal(name: str) -> None:
    (args,) = args_of(name)
    if name == "CMD":
        assert exec_form(args) == []
    else:
        assert args == "SIGTERM"
