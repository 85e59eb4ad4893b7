"""The zygote of ``memgov pack --runner preload``: import the framework once, fork every job.

``python -m memgov.pack._zygote --framework torch --socket PATH --status FILE`` binds PATH (in a
0700 folder of pack's), prints ``listening`` on stdout, imports the framework (never initialising
CUDA: no ``torch.cuda`` call, no JAX backend), collects and freezes the garbage collector's objects
(``gc.freeze``: the collector then never writes to the imported objects, whose pages stay shared
copy-on-write with every child) and serves. Each connection is one job's launcher
(memgov/pack/_launch.py) with its request (argv, env, cwd, CPU affinity, umask) and its
stdin/stdout/stderr. The zygote forks; the child becomes the job (:func:`become_job`); the zygote
tells the launcher the child's PID, reaps the child (a pidfd per child) and reports its wait
status. A launcher whose connection closes (SIGKILLed by pack) gets its child's process group
SIGKILLed. The zygote ends on SIGTERM/SIGINT/SIGHUP or when pack's end of its stdin closes (pack
died), killing any child left; children also have PR_SET_PDEATHSIG against the zygote.

Forking is only safe from a single-threaded process. Importing numpy (torch and JAX import it)
starts OpenBLAS's thread pool, which OpenBLAS itself stops before every fork (pthread_atfork); a
probe fork after the import checks that no thread survives a fork. If one does (TensorFlow's
jemalloc background thread), the zygote forks nothing and answers ``spawn``: launchers exec their
jobs as the process runner would.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from memgov.pack import _forked

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
JOB_SIGNALS = (*STOP_SIGNALS, signal.SIGUSR1, signal.SIGUSR2)
"""What launchers forward to their job."""
REQUEST_TIMEOUT_S = 10.0
"""A launcher sends its request right after connecting; one that does not is dropped."""
MAX_REQUEST = 8 * 2**20
PR_SET_PDEATHSIG = 1


@dataclass
class Request:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    cpus: list[int]
    umask: int
    fds: list[int] = field(default_factory=list)


@dataclass
class _Child:
    pid: int
    conn: socket.socket | None
    pidfd: int


class Zygote:
    def __init__(self, listener: socket.socket, spawn_reason: str | None) -> None:
        self.listener = listener
        self.spawn_reason = spawn_reason
        """Why this zygote forks nothing (launchers exec their jobs), or None."""
        self.children: dict[int, _Child] = {}
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.forked = 0
        self.why = "the zygote stopped"
        self._pid = os.getpid()

    def serve(self) -> Request | None:
        """Serve until told to stop (returns None, in the zygote) or, in a forked child, return
        the child's request (the zygote's loop is gone from the child's stack then)."""
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        with contextlib.suppress(ValueError, OSError):  # stdin is pack's pipe: EOF = pack died
            self.selector.register(0, selectors.EVENT_READ, "parent")
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop)
        try:
            while not self.stopping:
                for key, _events in self.selector.select(timeout=0.5):
                    request = self._handle(key.data)
                    if request is not None:
                        return request
        finally:
            if os.getpid() == self._pid:
                self._shutdown()
        return None

    def _stop(self, signum: int, _frame: object) -> None:
        self.stopping = True
        self.why = f"the zygote got {signal.Signals(signum).name}"

    def _handle(self, what: Any) -> Request | None:
        if what == "accept":
            return self._accept()
        if what == "parent":
            if not os.read(0, 4096):
                self.stopping = True
                self.why = "pack ended (the zygote's stdin closed)"
                self.selector.unregister(0)
            return None
        kind, pid = what
        child = self.children.get(pid)
        if child is None:
            return None
        if kind == "exited":
            self._reap(child)
        elif kind == "launcher":
            assert child.conn is not None
            try:
                gone = not child.conn.recv(1)
            except OSError:
                gone = True
            if gone:  # the launcher died (SIGKILL): its job goes with it
                _kill_job(pid)
                self._drop_conn(child)
        return None

    def _accept(self) -> Request | None:
        try:
            conn, _addr = self.listener.accept()
        except OSError:
            return None
        request = _read_request(conn)
        if request is None:
            conn.close()
            return None
        if self.spawn_reason is not None:
            _close_fds(request.fds)
            with contextlib.suppress(OSError):
                conn.sendall(f"spawn {self.spawn_reason}\n".encode())
            conn.close()
            return None
        if _task_count() > 1:
            _close_fds(request.fds)
            with contextlib.suppress(OSError):
                conn.sendall(f"spawn the zygote has {_task_count()} threads now\n".encode())
            conn.close()
            return None
        # Signals for the job stay pending in the child until it has its own handlers (the
        # launcher may forward one before the child has even left the zygote's session).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
        pid = os.fork()
        if pid == 0:
            self._in_child(conn)
            return request
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.forked += 1
        _close_fds(request.fds)
        pidfd = os.pidfd_open(pid)
        child = self.children[pid] = _Child(pid, conn, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, ("exited", pid))
        try:
            conn.sendall(f"pid {pid}\n".encode())
            self.selector.register(conn, selectors.EVENT_READ, ("launcher", pid))
        except OSError:  # the launcher is gone already
            _kill_job(pid)
            self._drop_conn(child)
        return None

    def _in_child(self, conn: socket.socket) -> None:
        """The forked child, before it becomes the job: leave the zygote's session and drop
        every descriptor of the zygote's."""
        os.setsid()
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self._pid:  # the zygote died between fork and prctl
            os._exit(70)
        self.selector.close()
        self.listener.close()
        conn.close()
        for other in self.children.values():
            os.close(other.pidfd)
            if other.conn is not None:
                other.conn.close()

    def _reap(self, child: _Child) -> None:
        try:
            _pid, status = os.waitpid(child.pid, 0)
        except ChildProcessError:
            status = signal.SIGKILL  # a wait status "killed by SIGKILL"; never expected
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        del self.children[child.pid]
        if child.conn is not None:
            with contextlib.suppress(OSError):
                child.conn.sendall(f"exit {status}\n".encode())
            self._drop_conn(child)

    def _drop_conn(self, child: _Child) -> None:
        if child.conn is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(child.conn)
        child.conn.close()
        child.conn = None

    def _shutdown(self) -> None:
        """Kill what is still running (pack stops the zygote after its jobs have ended) and tell
        those jobs' launchers why."""
        for pid in list(self.children):
            _kill_job(pid)
        for child in list(self.children.values()):
            if child.conn is not None:
                with contextlib.suppress(OSError):
                    child.conn.sendall(
                        f"error {self.why} while the job ran (pid {child.pid}); "
                        "the job was killed\n".encode()
                    )
                self._drop_conn(child)
            self._reap(child)
        self.listener.close()


def _kill_job(pid: int) -> None:
    """SIGKILL a forked job and its process group. Both: until the child has run setsid() (just
    after fork) its group is still the zygote's, and killpg(pid) finds no group of that id."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _read_request(conn: socket.socket) -> Request | None:
    fds: list[int] = []
    try:
        conn.settimeout(REQUEST_TIMEOUT_S)
        data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
        while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
            if len(data) > MAX_REQUEST:
                raise ValueError("request too large")
            more = conn.recv(65536)
            if not more:
                raise ValueError("request cut short")
            data += more
        conn.setblocking(True)
        raw = json.loads(data[4:].decode("utf-8"))
        if len(fds) != 3:
            raise ValueError("expected 3 descriptors")
        return Request(
            list(raw["argv"]),
            dict(raw["env"]),
            str(raw["cwd"]),
            list(raw["cpus"]),
            int(raw["umask"]),
            fds,
        )
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        _close_fds(fds)
        return None


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _task_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _thread_names() -> list[str]:
    names = []
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir("/proc/self/task")):
            if int(tid) != os.getpid():
                with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
    return names


def preload(framework: str) -> dict[str, Any]:
    """Import ``framework`` and what a governed child needs; decide whether forking is safe."""
    status: dict[str, Any] = {"framework": framework, "pid": os.getpid()}
    began = time.monotonic()
    try:
        importlib.import_module(framework)
    except Exception as exc:  # the jobs will say it themselves: they are spawned normally
        status["spawn_reason"] = (
            f"the zygote could not import {framework} ({type(exc).__name__}: {exc})"
        )
        return status
    status["import_s"] = round(time.monotonic() - began, 3)
    try:  # the zygote reaps through pidfds (Linux >= 5.3)
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        status["spawn_reason"] = f"no pidfd_open here ({exc}): Linux >= 5.3 is needed"
        return status
    # memgov's own start-up path of a governed job, so children share it too.
    from memgov import _autoenable, _claim  # noqa: F401

    status["threads_after_import"] = _task_count()
    status["thread_names"] = _thread_names()
    gc.collect()
    gc.freeze()
    survivors, names = _probe_fork()
    status["threads_through_fork"] = survivors
    if survivors > 1:
        status["spawn_reason"] = (
            f"{framework} leaves {survivors - 1} thread(s) running through fork "
            f"({', '.join(names) or 'unnamed'}); forking a multi-threaded process is unsafe"
        )
    return status


def _probe_fork() -> tuple[int, list[str]]:
    """Threads left in this process right after a fork, and the others' names: libraries that
    stop their threads in a pre-fork handler (OpenBLAS) drop out, any other thread would run on
    through every fork."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    after, names = _task_count(), _thread_names()
    os.waitpid(pid, 0)
    return after, names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memgov.pack._zygote")
    parser.add_argument("--framework", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--status", required=True)
    args = parser.parse_args(argv)
    startup: dict[int, Any] = {sig: signal.getsignal(sig) for sig in _forked.RESTORED}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(4096)
    print("listening", flush=True)
    status = preload(args.framework)
    _write_status(args.status, status)
    zygote = Zygote(listener, status.get("spawn_reason"))
    request = zygote.serve()
    if request is None:
        status["forked"] = zygote.forked
        _write_status(args.status, status)
        return 0
    return _forked.become_job(
        request.argv, request.env, request.cwd, request.cpus, request.umask, request.fds, startup
    )


def _write_status(path: str, status: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump(status, out)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
