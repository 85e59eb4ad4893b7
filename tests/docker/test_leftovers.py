"""A test session killed before its teardown: the next one stops its Docker engines and removes
their folders, and nothing else (tests/docker/leftovers.py). Fake engines (processes named
dockerd) and folders in a temporary place: no engine, and no change to the host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker import leftovers

GONE = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
"""A session pid that runs nowhere (above the largest pid the kernel gives)."""


def fake_engine(*args: str) -> subprocess.Popen[bytes]:
    """A process whose name is dockerd and whose arguments are ``args``."""
    code = "import time; time.sleep(120)"
    argv = ["bash", "-c", 'exec -a dockerd "$0" -c "$1" "${@:2}"', sys.executable, code, *args]
    return subprocess.Popen(argv)


@pytest.fixture
def engines() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs = {
        "gone": fake_engine("--pidfile", f"/var/run/memgov-test-dockerd-{GONE}.pid"),
        "gone_userns": fake_engine("-H", f"unix:///var/run/memgov-test-userns-{GONE}.sock"),
        "live": fake_engine("--pidfile", f"/var/run/memgov-test-dockerd-{os.getpid()}.pid"),
        "someone_elses": fake_engine("--bridge=none"),
    }
    deadline = time.monotonic() + 10
    while any(
        Path(f"/proc/{p.pid}/cmdline").read_bytes()[:7] != b"dockerd" for p in procs.values()
    ):
        assert time.monotonic() < deadline, "the fake engines did not start"
        time.sleep(0.05)
    try:
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_the_engines_of_a_session_that_is_gone_are_stopped_and_no_other(
    engines: dict[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    found = set(leftovers.orphaned_engines())
    mine = {name: proc.pid for name, proc in engines.items()}
    assert {mine["gone"], mine["gone_userns"]} <= found
    assert mine["live"] not in found and mine["someone_elses"] not in found
    done = leftovers.remove(timeout=10, run=tmp_path, lib=tmp_path, among=set(mine.values()))
    assert len(done) == 2
    for name in ("gone", "gone_userns"):
        assert engines[name].wait(timeout=10) == -15  # SIGTERM: dockerd's own clean stop
    assert engines["live"].poll() is None and engines["someone_elses"].poll() is None


def test_the_folders_of_a_session_that_is_gone_are_removed_and_no_other(tmp_path: Path) -> None:
    run, lib = tmp_path / "run", tmp_path / "lib"
    run.mkdir()
    lib.mkdir()
    gone = [
        lib / f"memgov-test-userns-{GONE}-abc123",
        lib / f"memgov-test-userns-{GONE}-abc123.100000.100000",
        run / f"memgov-test-userns-{GONE}-def456",
        run / f"memgov-test-userns-{GONE}.sock",
        run / f"memgov-test-dockerd-{GONE}.pid",
    ]
    kept = [
        lib / f"memgov-test-userns-{os.getpid()}-ghi789",  # a live session's
        run / f"memgov-test-dockerd-{os.getpid()}.pid",
        lib / "memgov-test-userns-kjd2r52o",  # no session pid in it: not known to be ours
        run / "docker.pid",
    ]
    for path in gone + kept:
        if path.suffix in (".sock", ".pid"):
            path.write_text("1\n")
        else:
            (path / "inside").mkdir(parents=True)
    mounted = _bind_mount(tmp_path / "source", gone[0] / "inside")
    leftovers.remove(run=run, lib=lib, among=set())
    assert [p for p in gone if os.path.lexists(p)] == []
    assert all(p.exists() for p in kept)
    if mounted:
        assert not any(
            str(gone[0]) in line for line in Path("/proc/self/mounts").read_text().splitlines()
        )


def _bind_mount(source: Path, target: Path) -> bool:
    """A bind mount under a dead session's data root, as dockerd's userns remapping leaves
    one; only where this process may mount (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        return False
    source.mkdir()
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    return done.returncode == 0
