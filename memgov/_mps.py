"""memgov's own NVIDIA MPS control daemon: start, status, stop, and a context manager for pack.

The daemon's pipe and log folders live under memgov's folder (``$MEMGOV_DIR/mps/{pipe,log}``),
never at the system default (/tmp/nvidia-mps), so it cannot collide with a daemon someone else
runs. A client process reaches it through ``CUDA_MPS_PIPE_DIRECTORY`` (set by ``claim()`` in hard
mode). A small state file records who started it, so ``stop`` only stops a daemon memgov started.

``nvidia-cuda-mps-control -d`` starts the daemon in the background (NVIDIA MPS docs, "Tools and
Interface Reference"); _mpsctl holds the queries and paths (import them from there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from memgov import _config
from memgov._mpsctl import (
    DEFAULT_PIPE,
    LOG_ENV,
    MPS_PREFIX,
    PIPE_ENV,
    MpsError,
    Paths,
    binary,
    client_limit,
    client_pids,
    daemon_pid,
    paths,
    query,
    reachable,
    require_binary,
    server_pids,
)
from memgov._signals import raise_on_signals

__all__ = ["daemon", "read_state", "start", "status", "stop"]
_CLIENT_ENV = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
"""Set on a daemon, these become the default of every client: never pass memgov's own to it."""


# -- status ------------------------------------------------------------------------------------
def status() -> dict[str, Any]:
    """The daemon in memgov's folder: reachable or not, its servers and their clients."""
    p = paths()
    state = read_state()
    program = binary()
    running = reachable(p.pipe)
    by_server = {pid: client_pids(p.pipe, pid) for pid in server_pids(p.pipe)} if running else {}
    servers = [{"pid": pid, "clients": c} for pid, c in by_server.items()]
    clients = sorted({c for found in by_server.values() for c in found})
    return {
        "binary": program,
        "running": running,
        "pipe": str(p.pipe),
        "log": str(p.log),
        "daemon_pid": daemon_pid(p.pipe) if running else None,
        "started_by_memgov": bool(state) and running,
        "state": state,
        "servers": servers,
        "clients": clients,
        "clients_per_gpu": _clients_per_gpu(clients),
        "client_limit": client_limit(),
        "default_daemon": reachable(DEFAULT_PIPE) if program else False,
    }


def _clients_per_gpu(clients: list[int]) -> dict[str, int]:
    if not clients:
        return {}
    from memgov import _devices, _nvml

    if _devices.simulated_spec() is not None:
        return {}
    counts: dict[str, int] = {}
    for device in _devices.devices():
        seen = _nvml.processes(device.uuid) or {}
        counts[device.uuid] = sum(1 for pid in clients if pid in seen)
    return counts


# -- start and stop ----------------------------------------------------------------------------
def start(timeout: float = 10.0) -> dict[str, Any]:
    """Start a control daemon for every GPU of the host, in memgov's folder; return its status."""
    program = require_binary()
    p = paths()
    _make_dirs(p)
    with _lock(p):
        if reachable(p.pipe):
            raise MpsError(
                f"an MPS control daemon already runs with pipe folder {p.pipe} (pid "
                f"{daemon_pid(p.pipe)}); `memgov mps status` shows it, `memgov mps stop` stops it"
            )
        env = {**os.environ, PIPE_ENV: str(p.pipe), LOG_ENV: str(p.log)}
        # The daemon serves every GPU: a CUDA_VISIBLE_DEVICES here would renumber them for all
        # its clients (NVIDIA MPS docs, CUDA_VISIBLE_DEVICES).
        for name in ("CUDA_VISIBLE_DEVICES", *_CLIENT_ENV):
            env.pop(name, None)
        out_path = p.log / "start.out"
        # Output to a file, not a pipe: a daemon that keeps our pipe open would block run().
        with open(out_path, "w") as out:
            done = subprocess.run(
                [program, "-d"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                timeout=timeout, check=False, start_new_session=True,
            )
        said = out_path.read_text(errors="replace").strip()
        if done.returncode != 0:
            raise MpsError(f"{program} -d exited with {done.returncode}: {said or 'no output'}")
        state = {
            "pid": None,
            "started_by": os.getpid(),
            "uid": os.getuid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "pipe": str(p.pipe),
            "log": str(p.log),
        }
        _write_state(p, state)  # at once: an interrupted start can still be cleaned up
        deadline = time.monotonic() + timeout
        while not reachable(p.pipe):
            if time.monotonic() > deadline:
                raise MpsError(
                    f"the MPS daemon did not answer on {p.pipe} within {timeout:g} s; "
                    f"see {p.log}/control.log {said}".strip()
                )
            time.sleep(0.1)
        _write_state(p, {**state, "pid": daemon_pid(p.pipe)})
    return status()


def stop(force: bool = False, timeout: float = 10.0) -> dict[str, Any]:
    """Stop memgov's daemon and its servers: ``quit``, wait, then SIGTERM/SIGKILL what is left.

    Refuses (unless ``force``) a daemon memgov did not start, or one that still has clients.
    Returns what was done, and ``left`` (processes still running; empty on success).
    """
    import psutil

    p = paths()
    with _lock(p):
        state = read_state()
        running = reachable(p.pipe)
        if not running and state is None:
            return {"stopped": False, "actions": [f"no MPS daemon runs with pipe folder {p.pipe}"],
                    "left": []}
        if state is None and not force:
            raise MpsError(
                f"the MPS daemon on {p.pipe} was not started by memgov (no {p.state}); "
                "pass --force to stop it anyway"
            )
        owner = state.get("uid") if state else None
        if owner is not None and owner != os.getuid() and os.getuid() != 0 and not force:
            raise MpsError(f"the MPS daemon on {p.pipe} was started by uid {owner}; only that "
                           "user or root can stop it")
        servers = server_pids(p.pipe) if running else []
        clients = sorted({c for s in servers for c in client_pids(p.pipe, s)})
        if clients and not force:
            raise MpsError(
                f"{len(clients)} client process(es) still use the MPS daemon (pids "
                f"{', '.join(map(str, clients))}); stopping it ends their GPU work: wait for them "
                "or pass --force"
            )
        known: dict[int, Any] = {}
        daemon = daemon_pid(p.pipe) if running else None
        candidates = {daemon, (state or {}).get("pid"), *servers}
        for pid in (x for x in candidates if isinstance(x, int)):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                # Never a reused PID of something else. The kernel cuts names to 15 characters
                # ("nvidia-cuda-mps"), so the prefix is what can be relied on.
                if proc.name().startswith(MPS_PREFIX):
                    known[pid] = proc
        actions: list[str] = []
        if not running:
            actions.append(f"no daemon answers on {p.pipe}; clearing what memgov recorded")
        elif query("quit", p.pipe) is not None:
            actions.append("sent quit")
        left = _wait_gone(list(known.values()), timeout)
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
            for proc in left:
                try:
                    proc.send_signal(sig)
                    actions.append(f"{sig.name} to {proc.name()} {proc.pid}")
                except psutil.NoSuchProcess:
                    pass
                except psutil.AccessDenied:
                    actions.append(f"no permission to signal {proc.pid}")
            left = _wait_gone(left, grace)
        if not left and not reachable(p.pipe):
            with contextlib.suppress(FileNotFoundError):
                p.state.unlink()
        still = {x.pid for x in left}
        actions.extend(f"{_name(proc)} {pid} exited" for pid, proc in known.items()
                       if pid not in still)
        return {
            "stopped": not left,
            "daemon_pid": daemon,
            "servers": servers,
            "clients_at_stop": clients,
            "actions": actions,
            "left": [{"pid": x.pid, "name": _name(x)} for x in left],
        }


@contextlib.contextmanager
def daemon(timeout: float = 10.0) -> Iterator[dict[str, Any]]:
    """Run memgov's daemon for the ``with`` block, also stopping it on SIGTERM, SIGHUP or Ctrl-C.

    A daemon that already runs in memgov's folder is used and left running (it is not ours).
    """
    if reachable(paths().pipe):
        yield {**status(), "started_here": False}
        return
    restore = raise_on_signals()
    try:
        info = start(timeout)
        yield {**info, "started_here": True}
    finally:
        try:
            if (read_state() or {}).get("started_by") == os.getpid():  # ours, even half-started
                stop(force=True, timeout=timeout)
        finally:
            restore()


# -- helpers -----------------------------------------------------------------------------------
def read_state() -> dict[str, Any] | None:
    try:
        data = json.loads(paths().state.read_text())
    except (FileNotFoundError, ValueError, OSError):
        return None
    return data if isinstance(data, dict) else None


def _write_state(p: Paths, data: dict[str, Any]) -> None:
    tmp = p.root / f".state-{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p.state)


def _make_dirs(p: Paths) -> None:
    from memgov import _records

    with _records.open_dir(p.root.parent, (), create=True):
        pass  # memgov's shared folder, made the same way the ledger makes it
    for folder in (p.root, p.pipe, p.log):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o755)  # other users' clients need to reach the pipes
        if folder.is_symlink() or not folder.is_dir():
            raise MpsError(f"{folder} is a symlink or not a folder; memgov never follows symlinks")


def _lock(p: Paths) -> Any:
    from filelock import FileLock

    _make_dirs(p)
    return FileLock(str(p.lock), timeout=_config.LOCK_TIMEOUT_S)


def _wait_gone(procs: list[Any], timeout: float) -> list[Any]:
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        left = [x for x in procs if _running(x, psutil)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def _running(proc: Any, psutil: Any) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _name(proc: Any) -> str:
    try:
        return str(proc.name())
    except Exception:
        return "?"
