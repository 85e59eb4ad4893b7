"""What a killed test session left of its Docker engines, found and removed by the next one.

A session's fixtures (tests/docker/conftest.py) stop the engines they started and remove their
folders in their teardown; a session killed before it (SIGKILL, a CI timeout, a lost terminal)
leaves both: a dockerd running in its own session, its containerd, a userns data root with a
bind mount under it. Every such engine and folder carries the pid of the session that made it
(SESSION_PID in their names), so a later session removes exactly those whose session is gone,
and never another live session's, nor an engine someone else runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.host_changes import SESSION_PID, session_gone

RUN = Path("/var/run")
LIB = Path("/var/lib")
PIDFILE = f"memgov-test-dockerd-{SESSION_PID}.pid"
"""The default engine's --pidfile, in RUN: names the session that started it."""
USERNS_SOCKET = f"memgov-test-userns-{SESSION_PID}.sock"
"""The userns engine's socket, in RUN: per session, so two sessions never share a daemon."""
USERNS_PREFIX = f"memgov-test-userns-{SESSION_PID}-"
"""Its data root (in LIB) and exec root (in RUN) start so (tempfile.mkdtemp's prefix)."""
_OURS = re.compile(r"memgov-test-(?:dockerd|userns)-(\d+)(?:\.pid|\.sock|-)")
"""A path of ours, and the pid of the session that made it."""
STOP_S = 60.0


def _ours_and_dead(text: str) -> bool:
    found = _OURS.search(text)
    return found is not None and session_gone(int(found.group(1)))


def orphaned_engines(proc: Path = Path("/proc")) -> list[int]:
    """dockerd processes started by test sessions that are gone: one of their arguments (the
    pid file, the socket, the data root) names a session pid that no longer runs."""
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            argv = (proc / entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if not argv or os.path.basename(argv[0]) != b"dockerd":
            continue
        if any(_ours_and_dead(arg.decode(errors="replace")) for arg in argv[1:]):
            found.append(int(entry))
    return found


def _stop(pid: int, timeout: float) -> None:
    """SIGTERM (dockerd stops its containers and containerd), SIGKILL after ``timeout``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _mounts_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder``, deepest first (as /proc/self/mounts escapes them)."""
    points = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) < 2:
            continue
        point = fields[1].replace("\\040", " ")
        if point == str(folder) or point.startswith(f"{folder}/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def orphaned_folders(run: Path = RUN, lib: Path = LIB) -> list[Path]:
    """Folders, sockets and pid files of ours whose session is gone."""
    found = []
    for base in (run, lib):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        found += [base / n for n in names if n.startswith("memgov-test-") and _ours_and_dead(n)]
    return sorted(found)


def remove(
    timeout: float = STOP_S, run: Path = RUN, lib: Path = LIB, among: set[int] | None = None
) -> list[str]:
    """Stop the engines of sessions that are gone (``among``: only these pids), then unmount and
    remove their folders; what was done, one line each."""
    done = []
    for pid in orphaned_engines():
        if among is not None and pid not in among:
            continue
        _stop(pid, timeout)
        done.append(f"stopped dockerd {pid} of a test session that is gone")
    for path in orphaned_folders(run, lib):
        for point in _mounts_under(path):
            subprocess.run(["umount", point], capture_output=True, timeout=60, check=False)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        done.append(f"removed {path}")
    return done
