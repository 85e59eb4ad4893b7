"""memgov's own NVIDIA MPS control daemons: start, status, stop, and a context manager for pack.

Each daemon's pipe and log folders live under memgov's folder (``$MEMGOV_DIR/mps/{pipe,log}`` for
daemon 0, ``pipe-k``/``log-k`` for daemon k), never at the system default (/tmp/nvidia-mps), so
they cannot collide with a daemon someone else runs. One daemon's server admits 48 clients per
GPU; several daemons admit 48 each (docs/hard-limits.md). A client reaches a daemon through
``CUDA_MPS_PIPE_DIRECTORY``, set by ``claim()`` in hard mode for the daemon admission picked. A
small state file per daemon records who started it, so ``stop`` only stops what memgov started.

``nvidia-cuda-mps-control -d`` starts the daemon in the background (NVIDIA MPS docs, "Tools and
Interface Reference"); _mpsctl holds the queries and paths (import them from there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import MemgovError
from memgov._base.signals import raise_on_signals
from memgov._files import flock as _flock
from memgov._gpu.mpsctl import (
    DEFAULT_PIPE,
    LOG_ENV,
    MAX_DAEMONS,
    MPS_PREFIX,
    PIPE_ENV,
    MpsError,
    Paths,
    binary,
    client_limit,
    client_pids,
    daemon_pid,
    paths,
    policy,
    query,
    reachable,
    require_binary,
    running_daemons,
    server_pids,
)

__all__ = ["daemon", "read_state", "start", "status", "stop"]
_CLIENT_ENV = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
"""Set on a daemon, these become the default of every client: never pass memgov's own to it."""


# -- status ------------------------------------------------------------------------------------
def status() -> dict[str, Any]:
    """memgov's daemons: which answer, their servers and their clients.

    The top-level ``pipe``/``log``/``daemon_pid``/``state`` are daemon 0's; ``daemons`` lists each
    daemon that answers or that memgov recorded; ``servers`` and ``clients`` cover all of them.
    """
    program = binary()
    each = [_one_status(k) for k in range(MAX_DAEMONS)]
    each = [d for d in each if d["running"] or d["state"] or d["daemon"] == 0]
    first = each[0]
    servers = [s for d in each for s in d["servers"]]
    clients = sorted({c for d in each for c in d["clients"]})
    return {
        "binary": program,
        "running": any(d["running"] for d in each),
        "pipe": first["pipe"],
        "log": first["log"],
        "daemon_pid": first["daemon_pid"],
        "started_by_memgov": first["started_by_memgov"],
        "state": first["state"],
        "daemons": each,
        "running_daemons": sum(1 for d in each if d["running"]),
        "servers": servers,
        "clients": clients,
        "clients_per_gpu": _clients_per_gpu(clients),
        "client_limit": client_limit(),
        "policy": policy(),
        "default_daemon": reachable(DEFAULT_PIPE) if program else False,
    }


def _one_status(k: int) -> dict[str, Any]:
    p = paths(k)
    state = read_state(k)
    running = reachable(p.pipe)
    by_server = {pid: client_pids(p.pipe, pid) for pid in server_pids(p.pipe)} if running else {}
    return {
        "daemon": k,
        "running": running,
        "pipe": str(p.pipe),
        "log": str(p.log),
        "daemon_pid": daemon_pid(p.pipe) if running else None,
        "started_by_memgov": bool(state) and running,
        "state": state,
        "servers": [{"pid": pid, "clients": c, "daemon": k} for pid, c in by_server.items()],
        "clients": sorted({c for found in by_server.values() for c in found}),
    }


def _clients_per_gpu(clients: list[int]) -> dict[str, int]:
    if not clients:
        return {}
    from memgov._gpu import devices as _devices, nvml as _nvml

    if _devices.simulated_spec() is not None:
        return {}
    counts: dict[str, int] = {}
    for device in _devices.devices():
        seen = _nvml.processes(device.uuid) or {}
        counts[device.uuid] = sum(1 for pid in clients if pid in seen)
    return counts


# -- start and stop ----------------------------------------------------------------------------
def start(timeout: float = 10.0, daemons: int = 1) -> dict[str, Any]:
    """Start control daemons 0 to ``daemons`` - 1 (those not running), for every GPU of the host,
    in memgov's folder; return the status, with ``started`` and each one's ``start_s``."""
    if not 1 <= daemons <= MAX_DAEMONS:
        raise MpsError(f"--daemons {daemons}: accepted 1 to {MAX_DAEMONS}")
    program = require_binary()
    started: dict[int, float] = {}
    with _lock(paths()):
        missing = [k for k in range(daemons) if not reachable(paths(k).pipe)]
        if not missing:
            p = paths(daemons - 1)
            raise MpsError(
                f"{daemons} MPS control daemon(s) already run (the last with pipe folder "
                f"{p.pipe}, pid {daemon_pid(p.pipe)}); `memgov mps status` shows them, "
                "`memgov mps stop` stops them"
            )
        for k in missing:
            t0 = time.monotonic()
            _start_one(k, program, timeout)
            started[k] = round(time.monotonic() - t0, 3)
    return {**status(), "started": sorted(started), "start_s": started}


def _start_one(k: int, program: str, timeout: float) -> None:
    p = paths(k)
    _make_dirs(p)
    env = {**os.environ, PIPE_ENV: str(p.pipe), LOG_ENV: str(p.log)}
    # The daemon serves every GPU: a CUDA_VISIBLE_DEVICES here would renumber them for all its
    # clients (NVIDIA MPS docs, CUDA_VISIBLE_DEVICES).
    for name in ("CUDA_VISIBLE_DEVICES", *_CLIENT_ENV):
        env.pop(name, None)
    # Output to a file, not a pipe: a daemon that keeps our pipe open would block run(). The
    # file is made afresh in memgov's checked log folder, never through a link (_write_new).
    with _open_dir(p.log) as folder, _write_new(folder, "start.out", p.log) as out:
        done = subprocess.run(
            [program, "-d"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
        out.seek(0)
        said = out.read(64 * 1024).decode(errors="replace").strip()
    if done.returncode != 0:
        raise MpsError(f"{program} -d exited with {done.returncode}: {said or 'no output'}")
    state = {
        "pid": None,
        "started_by": os.getpid(),
        "uid": os.getuid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "daemon": k,
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
        time.sleep(0.05)
    _write_state(p, {**state, "pid": daemon_pid(p.pipe)})


def stop(
    force: bool = False, timeout: float = 10.0, only: list[int] | None = None
) -> dict[str, Any]:
    """Stop memgov's daemons and their servers: ``quit``, wait, then SIGTERM/SIGKILL what is left.

    Refuses (unless ``force``) a daemon memgov did not start, or one that still has clients;
    every daemon is checked before any is stopped. ``only``: just these daemon numbers.
    Returns what was done, and ``left`` (processes still running; empty on success).
    """
    with _lock(paths()):
        numbers = only if only is not None else list(range(MAX_DAEMONS))
        found = [k for k in numbers if reachable(paths(k).pipe) or read_state(k) is not None]
        if not found:
            return {
                "stopped": False,
                "daemons": [],
                "actions": [f"no MPS daemon runs with pipe folder {paths().pipe}"],
                "left": [],
            }
        checked = [(k, _stop_check(k, force)) for k in found]
        reports = [_stop_one(k, found_state, timeout) for k, found_state in checked]
    return {
        "stopped": all(r["stopped"] for r in reports),
        "daemons": found,
        "daemon_pid": reports[0]["daemon_pid"],
        "servers": [s for r in reports for s in r["servers"]],
        "clients_at_stop": sorted({c for r in reports for c in r["clients_at_stop"]}),
        "actions": [a for r in reports for a in r["actions"]],
        "left": [x for r in reports for x in r["left"]],
    }


def _stop_check(k: int, force: bool) -> tuple[dict[str, Any] | None, bool, list[int], list[int]]:
    """(state, running, server pids, client pids) of daemon ``k``; raises what stop refuses."""
    p = paths(k)
    state = read_state(k)
    running = reachable(p.pipe)
    if running and state is None and not force:
        raise MpsError(
            f"the MPS daemon on {p.pipe} was not started by memgov (no {p.state}); "
            "pass --force to stop it anyway"
        )
    owner = state.get("uid") if state else None
    if owner is not None and owner != os.getuid() and os.getuid() != 0 and not force:
        raise MpsError(
            f"the MPS daemon on {p.pipe} was started by uid {owner}; only that "
            "user or root can stop it"
        )
    servers = server_pids(p.pipe) if running else []
    clients = sorted({c for s in servers for c in client_pids(p.pipe, s)})
    if clients and not force:
        raise MpsError(
            f"{len(clients)} client process(es) still use the MPS daemon (pids "
            f"{', '.join(map(str, clients))}); stopping it ends their GPU work: wait for them "
            "or pass --force"
        )
    return state, running, servers, clients


def _stop_one(
    k: int, found: tuple[dict[str, Any] | None, bool, list[int], list[int]], timeout: float
) -> dict[str, Any]:
    import psutil

    p = paths(k)
    state, running, servers, clients = found
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
        with contextlib.suppress(FileNotFoundError, MemgovError), _open_dir(p.root) as folder:
            os.unlink(p.state.name, dir_fd=folder)
    still = {x.pid for x in left}
    actions.extend(f"{_name(proc)} {pid} exited" for pid, proc in known.items() if pid not in still)
    if k:
        actions = [f"daemon {k}: {a}" for a in actions]
    return {
        "stopped": not left,
        "daemon_pid": daemon,
        "servers": servers,
        "clients_at_stop": clients,
        "actions": actions,
        "left": [{"pid": x.pid, "name": _name(x)} for x in left],
    }


@contextlib.contextmanager
def daemon(timeout: float = 10.0, daemons: int = 1) -> Iterator[dict[str, Any]]:
    """Run memgov's daemons 0 to ``daemons`` - 1 for the ``with`` block, also stopping them on
    SIGTERM, SIGHUP or Ctrl-C.

    Daemons that already run in memgov's folder are used and left running (they are not ours).
    """
    if all(reachable(paths(k).pipe) for k in range(daemons)):
        yield {**status(), "started_here": False, "started": [], "start_s": {}}
        return
    before = set(running_daemons())
    restore = raise_on_signals()
    try:
        info = start(timeout, daemons)
        yield {**info, "started_here": True}
    finally:
        try:
            ours = [
                k
                for k in range(MAX_DAEMONS)  # ours, even half-started
                if k not in before and (read_state(k) or {}).get("started_by") == os.getpid()
            ]
            if ours:
                stop(force=True, timeout=timeout, only=ours)
        finally:
            restore()


# -- helpers -----------------------------------------------------------------------------------
def read_state(k: int = 0) -> dict[str, Any] | None:
    p = paths(k)
    try:
        with _open_dir(p.root, create=False) as folder:  # read inside it: forks find it
            fd = os.open(
                p.state.name,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=folder,
            )
            with open(fd, "rb") as f:
                if not _mine(os.fstat(f.fileno())):
                    return None  # not a state file memgov wrote: someone else's
                data = json.loads(f.read(64 * 1024))
    except (OSError, ValueError, MemgovError):
        return None
    return data if isinstance(data, dict) else None


def _mine(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_uid in (0, os.geteuid())


def _write_state(p: Paths, data: dict[str, Any]) -> None:
    with _open_dir(p.root) as folder:
        _flock.write_atomic(folder, p.state.name, json.dumps(data, indent=1).encode())


@contextlib.contextmanager
def _open_dir(folder: Path, create: bool = True) -> Iterator[int]:
    """A checked descriptor of one of memgov's MPS folders (memgov/_files/trust.py's rule: root's or
    this user's, no one else may write it, no symlink anywhere below MEMGOV_DIR)."""
    root = _config.ledger_dir()
    with _flock.open_dir(root, folder.relative_to(root).parts, create=create) as fd:
        yield fd


@contextlib.contextmanager
def _write_new(folder: int, name: str, where: Path) -> Iterator[Any]:
    """A new file ``name`` in the open folder, for writing: an old one is removed first (unlink
    never follows a link), and O_EXCL | O_NOFOLLOW create it, so no link planted there is ever
    written through."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=folder)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o644, dir_fd=folder)
    except OSError as exc:
        raise MpsError(f"cannot write {where / name}: {exc.strerror or exc}") from None
    with open(fd, "w+b") as out:
        yield out


def _make_dirs(p: Paths) -> None:
    for folder in (p.root, p.pipe, p.log):
        with _open_dir(folder):
            pass  # made (0755: other users' clients reach the pipes) and checked


def _lock(p: Paths) -> Any:
    from memgov._files.flock import AdmissionLock

    _make_dirs(p)
    with _open_dir(p.root) as fd:
        folder = os.fstat(fd)
    return AdmissionLock(p.lock, _config.LOCK_TIMEOUT_S, may_create=True, folder=folder)


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
