"""Session fixtures of the container tests: podman's availability, checked once, and the images,
each built once a session and shared by the tests."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.podman import ROOT, build_image, compose_unusable, podman, unique, unusable

# The image users ran before this one: a data volume it wrote must be recovered by the image
# built now. The last commit before the image was built in CI (store and definitions formats
# as they were then); move it forward only to a commit whose image users really ran.
OLDER_IMAGE_COMMIT = "f0525f56c06d14e53af5a3de70b3e99a4e0cba79"


@pytest.fixture(scope="session")
def podman_ready() -> None:
    reason = unusable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def compose_ready(podman_ready: None) -> None:
    reason = compose_unusable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def image(podman_ready: None) -> Iterator[str]:
    """docker/Dockerfile built from this checkout; yields its session-unique tag. Removing it
    at the end removes the image's own stage; the build stage stays cached (its dependency
    layer most of all)."""
    tag = f"localhost/{unique('hare-test')}:latest"
    build_image(ROOT, tag)
    yield tag
    podman("rmi", tag, check=False)


@pytest.fixture(scope="session")
def older_image(podman_ready: None) -> str:
    """docker/Dockerfile as it was at OLDER_IMAGE_COMMIT, built from that commit's tree once
    per machine and kept (a tag of the commit's: the same image for every session)."""
    tag = f"localhost/hare-test-older:{OLDER_IMAGE_COMMIT[:12]}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(prefix="hare-older-") as tmp:
        archive = Path(tmp) / "tree.tar"
        done = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive),
                               OLDER_IMAGE_COMMIT], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (
            f"the older image's sources: git archive {OLDER_IMAGE_COMMIT}: {done.stderr}")
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "tree", filter="data")
        build_image(Path(tmp) / "tree", tag)
    return tag
