"""A real Docker engine for the container tests: the one that answers, or one started here.

Where no engine answers and the tests run as root, the ``docker_engine`` fixture installs Debian's
``docker.io`` and ``debootstrap`` with apt-get when ``dockerd`` is missing, and starts ``dockerd
--bridge=none --iptables=false`` (containers use ``--network none``, builds ``--network host``;
no network with addresses is ever made). It stops the daemon it started, and only that one;
what a session killed before its teardown left, the next session removes
(tests/docker/leftovers.py).
Each of these fixtures changes the host, so the tests using them run only with
``pytest --host-changes`` (tests/helpers/host_changes.py).
Anywhere else every test here is skipped, saying why (never a silent pass):
``MEMGOV_DOCKER_TESTS=off`` skips them on purpose, ``=no-install`` never runs apt-get.

The image is examples/docker's Dockerfile, built on a Debian base made with debootstrap
(examples/docker/base.sh; no image registry is needed) from a wheelhouse that ``pip download``
fills with the packages the test's own environment installed (examples/docker/build.sh serves it
on 127.0.0.1 to the build). Everything is made once per test session.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docker import leftovers
from tests.helpers.host_changes import changes_host
from tests.helpers.procs import terminate

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "memgov-base:bookworm"
IMAGE = "memgov-mnist:test"
USERNS_SOCKET = str(leftovers.RUN / leftovers.USERNS_SOCKET)
"""Per test session: two sessions on one machine must not share (and stop) each other's daemon."""
SETTING = "MEMGOV_DOCKER_TESTS"


@dataclass
class Engine:
    started_here: bool
    installed_here: bool
    version: str


def _answers(env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("docker") is None:
        return None
    try:
        return subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def _up(env: dict[str, str] | None = None) -> str | None:
    got = _answers(env)
    return got.stdout.strip() if got is not None and got.returncode == 0 else None


def _start_dockerd(
    args: list[str], log: Path, env: dict[str, str] | None, timeout: float = 90
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            ["dockerd", *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while _up(env) is None:
        if daemon.poll() is not None or time.monotonic() > deadline:
            _stop(daemon)
            tail = log.read_text(errors="replace")[-800:]
            pytest.skip(f"dockerd {' '.join(args)} did not come up: {tail}")
        time.sleep(0.5)
    return daemon


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    terminate(daemon, timeout=60)  # dockerd stops its containers and its containerd on SIGTERM


@pytest.fixture(scope="session")
@changes_host(
    "installs docker.io and debootstrap (about 28 packages) with apt-get where dockerd is "
    "missing, starts dockerd for the session"
)
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    setting = os.environ.get(SETTING, "").strip().lower()
    if setting == "off":
        pytest.skip(f"{SETTING}=off: container tests skipped on purpose")
    if os.geteuid() == 0:
        # A session killed before its teardown left its engines running (and the one it
        # started would answer _up() below, and never be stopped): stop those first.
        for line in leftovers.remove():
            sys.stderr.write(f"memgov tests: {line}\n")
    version = _up()
    if version is not None:
        yield Engine(started_here=False, installed_here=False, version=version)
        return
    if os.geteuid() != 0:
        pytest.skip(
            "no Docker engine answers (`docker version`) and the tests do not run as "
            "root, so none can be installed or started here"
        )
    installed = False
    if shutil.which("dockerd") is None or shutil.which("debootstrap") is None:
        if setting == "no-install":
            pytest.skip(f"no dockerd/debootstrap and {SETTING}=no-install")
        if shutil.which("apt-get") is None:
            pytest.skip("no Docker engine, no dockerd, and no apt-get to install docker.io")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "docker.io", "debootstrap"],
        ):
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=600, env=env, check=False
            )
            if done.returncode != 0:
                pytest.skip(f"{' '.join(argv)} failed: {(done.stderr or done.stdout)[-600:]}")
        installed = True
    log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    # The pid file names this session: a later one knows the engine (tests/docker/leftovers.py)
    pidfile = str(leftovers.RUN / leftovers.PIDFILE)
    daemon = _start_dockerd(["--bridge=none", "--iptables=false", "--pidfile", pidfile], log, None)
    try:
        yield Engine(started_here=True, installed_here=installed, version=_up() or "?")
    finally:
        _stop(daemon)


def _wheelhouse(folder: Path) -> Path:
    """The image's Python packages, as the test's own environment installed them."""
    torch = importlib.metadata.version("torch").split("+")[0]
    wanted = [f"torch=={torch}", "numpy", "setuptools>=68", "wheel"]
    wanted += importlib.metadata.requires("memgov-gpu") or []
    wanted = [w for w in wanted if "extra ==" not in w]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--only-binary=:all:",
            "-d",
            str(folder),
            *wanted,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip download for the image failed: {done.stderr[-800:]}")
    return folder


@pytest.fixture(scope="session")
@changes_host(
    f"builds the images {BASE_IMAGE} and {IMAGE} (about 1.2 GB) in the Docker engine and keeps "
    "them for the next run"
)
def docker_image(docker_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """examples/docker's image, built from this checkout on a local Debian base."""
    base = subprocess.run(
        [str(ROOT / "examples/docker/base.sh"), BASE_IMAGE],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert base.returncode == 0, f"base.sh failed: {base.stderr[-1500:]}"
    before = _image_id(IMAGE)
    wheels = _wheelhouse(tmp_path_factory.mktemp("wheels"))
    torch = importlib.metadata.version("torch").split("+")[0]
    build = subprocess.run(
        [
            str(ROOT / "examples/docker/build.sh"),
            "--tag",
            IMAGE,
            "--base",
            BASE_IMAGE,
            "--wheelhouse",
            str(wheels),
            "--torch",
            torch,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert build.returncode == 0, f"build.sh failed: {(build.stdout + build.stderr)[-2000:]}"
    if before is not None and before != _image_id(IMAGE):  # the last session's, now untagged
        subprocess.run(["docker", "rmi", before], capture_output=True, timeout=120, check=False)
    return IMAGE


def _image_id(name: str) -> str | None:
    got = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return got.stdout.strip() or None if got.returncode == 0 else None


@pytest.fixture(scope="session")
@changes_host(
    "starts a second dockerd with --userns-remap=default, which creates the user and group "
    "dockremap and gives them /etc/subuid and /etc/subgid ranges (kept)"
)
def userns_engine(docker_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second daemon with --userns-remap=default on its own socket and data root, holding the
    test image; stopped and its data root removed afterwards. Yields its DOCKER_HOST."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("a second dockerd (--userns-remap) needs root and dockerd")
    host = f"unix://{USERNS_SOCKET}"
    env = {**os.environ, "DOCKER_HOST": host}
    data = Path(tempfile.mkdtemp(prefix=leftovers.USERNS_PREFIX, dir=leftovers.LIB))
    run_dir = Path(tempfile.mkdtemp(prefix=leftovers.USERNS_PREFIX, dir=leftovers.RUN))
    log = tmp_path_factory.mktemp("dockerd-userns") / "dockerd.log"
    daemon = _start_dockerd(
        [
            "--userns-remap=default",
            "--bridge=none",
            "--iptables=false",
            "--data-root",
            str(data),
            "--exec-root",
            str(run_dir / "exec"),
            "--pidfile",
            str(run_dir / "dockerd.pid"),
            "-H",
            host,
        ],
        log,
        env,
    )
    try:
        save = subprocess.Popen(["docker", "save", docker_image], stdout=subprocess.PIPE)
        load = subprocess.run(
            ["docker", "load"],
            stdin=save.stdout,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        save.wait()
        assert load.returncode == 0, f"docker load into the userns daemon: {load.stderr}"
        yield host
    finally:
        _stop(daemon)
        # dockerd also makes "<folder>.100000.100000" beside the folders it remaps
        for made in (data, run_dir):
            for folder in (made, *made.parent.glob(f"{made.name}.*")):
                shutil.rmtree(folder, ignore_errors=True)
