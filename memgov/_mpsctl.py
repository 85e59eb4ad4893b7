"""Talking to an NVIDIA MPS control daemon: where it is, whether it answers, who its clients are.

Everything goes through ``nvidia-cuda-mps-control``, one command per invocation on stdin (NVIDIA
MPS docs, "Tools and Interface Reference"): ``get_server_list``, ``get_client_list <server pid>``,
``quit``. The daemon writes ``nvidia-cuda-mps-control.pid`` into its pipe folder. This module is
what claim() needs (see _enforce); _mps starts and stops memgov's own daemon.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from memgov import _config
from memgov._errors import MemgovError

CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"
MPS_PREFIX = "nvidia-cuda-mps"
"""What the kernel keeps of either name (process names are cut to 15 characters)."""
DEFAULT_PIPE = Path("/tmp/nvidia-mps")
"""Where CUDA looks for a daemon when CUDA_MPS_PIPE_DIRECTORY is unset."""
PID_FILE = "nvidia-cuda-mps-control.pid"
QUERY_TIMEOUT_S = 5.0
"""A control command that takes longer means no daemon reads the pipe (a stale FIFO)."""
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"


class MpsError(MemgovError):
    """The MPS daemon cannot be started, queried or stopped as asked."""


@dataclass(frozen=True)
class Paths:
    root: Path
    pipe: Path
    log: Path
    state: Path
    lock: Path


def paths() -> Paths:
    root = _config.ledger_dir() / "mps"
    return Paths(root, root / "pipe", root / "log", root / "state.json", root / "mps.lock")


def binary() -> str | None:
    return shutil.which(CONTROL)


def require_binary() -> str:
    found = binary()
    if found is None:
        raise MpsError(
            f"{CONTROL} is not on PATH; it ships with the NVIDIA driver's compute utilities "
            "(Debian/Ubuntu: nvidia-compute-utils-<version>), on the GPU host, not in pip. "
            "Without it claims stay soft (framework caps only)"
        )
    return found


# -- talking to a daemon -----------------------------------------------------------------------
def query(command: str, pipe: Path, timeout: float = QUERY_TIMEOUT_S) -> str | None:
    """The daemon's answer to one control command, or None when no daemon answers on ``pipe``."""
    program = binary()
    if program is None or not is_endpoint(pipe / "control"):
        return None
    env = {**os.environ, PIPE_ENV: str(pipe)}
    if pipe == paths().pipe:
        env[LOG_ENV] = str(paths().log)
    try:
        done = subprocess.run(
            [program], input=command + "\n", capture_output=True, text=True,
            timeout=timeout, env=env, check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    text = done.stdout + done.stderr
    if done.returncode != 0 or "cannot find mps control daemon" in text.lower():
        return None
    return done.stdout


def reachable(pipe: Path) -> bool:
    # Cheap first: claims ask this on their hot path, and 25 jobs starting at once queue up on the
    # control daemon (a 5 s query timed out there on the H200). The endpoint plus a live daemon
    # process is proof enough; only where the daemon's PID cannot be seen is it asked.
    if not is_endpoint(pipe / "control"):
        return False
    return _daemon_alive(pipe) or query("get_server_list", pipe) is not None


def _daemon_alive(pipe: Path) -> bool:
    import psutil

    try:
        pid = int((pipe / PID_FILE).read_text().strip())
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.name().startswith(MPS_PREFIX)
    except (OSError, ValueError, psutil.Error):
        return False


def server_pids(pipe: Path) -> list[int]:
    return pids(query("get_server_list", pipe))


def client_pids(pipe: Path, server: int) -> list[int]:
    return pids(query(f"get_client_list {server}", pipe))


def client_pipe() -> tuple[Path | None, bool]:
    """The pipe folder CUDA would use in this process, and whether it is memgov's daemon's.

    CUDA_MPS_PIPE_DIRECTORY, when set, is the only place CUDA looks. Otherwise memgov's folder
    (claim() then points CUDA at it), else the system default, which CUDA finds by itself.
    """
    mine = paths().pipe
    raw = os.environ.get(PIPE_ENV, "").strip()
    if raw:
        pipe = Path(raw)
        return (pipe if reachable(pipe) else None), pipe == mine
    for pipe in (mine, DEFAULT_PIPE):
        if reachable(pipe):
            return pipe, pipe == mine
    return None, False


def server_uids(pipe: Path) -> dict[int, int | None]:
    """Server PID -> the user it runs as (None where this process cannot see it)."""
    import psutil

    found: dict[int, int | None] = {}
    for pid in server_pids(pipe):
        try:
            found[pid] = psutil.Process(pid).uids().real
        except (psutil.Error, OSError):
            found[pid] = None
    return found


def client_limit() -> int:
    """Clients one MPS server admits per GPU (48 on Volta and later; MEMGOV_MPS_CLIENTS)."""
    raw = os.environ.get("MEMGOV_MPS_CLIENTS", "").strip()
    if not raw:
        return 48
    if not raw.isdigit() or int(raw) < 1:
        raise MpsError(
            f"MEMGOV_MPS_CLIENTS={raw!r}: accepted a whole number >= 1 (MPS admits 48 clients per "
            "GPU on Volta and later, 16 before)"
        )
    return int(raw)


def daemon_pid(pipe: Path) -> int | None:
    try:
        return int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        pass
    import psutil  # older drivers write no PID file: find the daemon serving this pipe

    for proc in psutil.process_iter(["name"]):
        if not str(proc.info["name"] or "").startswith(MPS_PREFIX):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(PIPE_ENV) == str(pipe):
                return proc.pid
    return None


def is_endpoint(path: Path) -> bool:
    """A UNIX socket (recent drivers) or a FIFO (older ones): the daemon's control endpoint."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)


def pids(text: str | None) -> list[int]:
    return [int(t) for t in (text or "").split() if t.isdigit()]
