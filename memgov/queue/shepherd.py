"""One attempt of one queued job: ``python -m memgov.queue.shepherd`` (started by the runner).

The shepherd is what makes a runner's death harmless. It reads its orders (command, folder,
environment, log) on stdin, then:

1. takes over the attempt's *live record* (``live/<name>.json``, flock-held:
memgov/_ledger/records.py)
   from the runner, which made it (``phase: launching``) and locked it before starting this
   process, which inherits the locked descriptor (``live_fd``): the lock is held without a gap
   from before the shepherd exists until it ends, so a record found unheld proves that no
   shepherd of the attempt runs or can still start; it rewrites it as its own (``phase:
   created``, its pid);
2. rewrites it with ``phase: starting`` just before it starts the command: a live record that
   died still at ``launching`` or ``created`` proves the command never started (the job is
   queued again);
3. starts the command in its own session (its output appended to the job's log), set to be
   killed when the shepherd dies (``PR_SET_PDEATHSIG``), records its pid (``phase: started``)
   and waits for it, watching the ledger for a wait of its claim behind a neighbour (not run
   time: ``waited`` in the result);
4. on SIGTERM, SIGINT or SIGHUP: SIGTERM to the command's process group, SIGKILL after the
   grace period;
5. writes the attempt's result (``results/<job>-<attempt>.json``: exit status, times, whether
   it was stopped) and only then releases its live record.

It runs in a session of its own: a runner killed with SIGKILL leaves it (and the command)
running; the next runner finds the live record held and waits for the result. Only a shepherd
killed between 3 and 5 leaves no result: the job is then ``lost`` (it may have finished), and
its command does not outlive it (killed with it; what is left of its process group, the runner
kills when it finds the attempt lost).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import LedgerError
from memgov._files import flock as _flock
from memgov._ledger import records as _records
from memgov._ledger.ledger import folder_name
from memgov.queue.store import Store

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LAUNCHING = "launching"
"""The live record's phase as the runner writes it, before its shepherd has taken it over: its
``pid`` is the runner's, not a shepherd's (never signalled)."""
LOOK_S = 0.5
"""How often the shepherd looks in the ledger's queue for its command's claim waiting."""
PR_SET_PDEATHSIG = 1


def shepherd_pid(data: dict[str, Any] | None) -> int | None:
    """The pid of the shepherd that holds a live record with content ``data``; None while the
    runner that made it holds it (``launching``) or when it names none."""
    pid = (data or {}).get("pid")
    if not isinstance(pid, int) or (data or {}).get("phase") == LAUNCHING:
        return None
    return pid


def live_payload(orders: dict[str, Any], phase: str, **extra: Any) -> dict[str, Any]:
    """A live record (the ledger's record fields, so _records reads it with its bounds)."""
    return {
        "version": 1,
        "id": f"{orders['id']}-{orders['attempt']}",
        "kind": "queue-run",
        "device": orders["device"],
        "bytes": orders["bytes"],
        "name": orders["name"],
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "created": time.time(),
        "job_id": orders["id"],
        "attempt": orders["attempt"],
        "phase": phase,
        **extra,
    }


class _Stop:
    def __init__(self) -> None:
        self.asked: float | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.asked is None:
            self.asked = time.monotonic()


def main() -> int:
    orders = json.loads(sys.stdin.read())
    store = Store()
    stop = _Stop()
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    held = store.inherited_live(orders["live"], orders["live_fd"])
    store.update_live(held, live_payload(orders, "created"))
    log = store.open_log(orders["id"])
    started = time.time()
    result: dict[str, Any] = {"start": started, "pid": None, "returncode": None}
    try:
        if stop.asked is None:
            store.update_live(held, live_payload(orders, "starting"))
            _banner(log, orders)
            # where the command's own output begins: the banner names the command, and a
            # command line that says "MemoryError" must not read as an out-of-memory end
            result["output_at"] = os.lseek(log, 0, os.SEEK_END)
            result["start"] = time.time()  # the command's own time, not the shepherd's start-up
            proc = _start(orders, log)
            result["pid"] = proc.pid
            store.update_live(held, live_payload(orders, "started", child=proc.pid))
            waited = _Waited(orders["device"], proc.pid)
            result["returncode"] = _wait(proc, stop, float(orders.get("grace", 10)), waited)
            result["waited"] = waited.seconds
        else:
            result["detail"] = "stopped before it started"
    except OSError as exc:
        result["detail"] = f"cannot start {orders['cmd'][0]!r}: {exc.strerror or exc}"
        os.write(log, f"memgov queue: {result['detail']}\n".encode())
    finally:
        os.close(log)
    result.update(end=time.time(), stopped=stop.asked is not None)
    store.write_result(orders["id"], orders["attempt"], result)
    store.end_live(held)
    return 0


def _banner(log: int, orders: dict[str, Any]) -> None:
    line = (
        f"memgov queue: job {orders['id']} attempt {orders['attempt']} on GPU {orders['gpu']} "
        f"with claim {orders['bytes']} bytes at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
        f"{' '.join(orders['cmd'])}\n"
    )
    os.write(log, line.encode())


def _start(orders: dict[str, Any], log: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        orders["cmd"],
        cwd=orders["cwd"],
        env=orders["env"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,  # its own process group: stopped as a whole
        preexec_fn=_dies_with(os.getpid()),
    )


def _dies_with(shepherd: int) -> Callable[[], None] | None:
    """What the command runs between fork and exec: SIGKILL to it when its shepherd dies. A
    command left running by a dead shepherd would hold its claim where no runner, no cancel
    and no result can reach it (its attempt is ``lost``)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # no prctl (not Linux): the runner kills the group when it finds it lost

    def set_up() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != shepherd:  # the shepherd died before the prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return set_up


class _Waited:
    """How long the command's claim waited in the ledger's queue (behind claims of others: a
    neighbour outside the queue, another user's runner placing at the same moment): from its
    ticket's creation to its claim's, both this user's records naming the command's pid. That
    time is not the job's run time (nor its solo time)."""

    def __init__(self, device: str, pid: int) -> None:
        self.parts = (_records.VERSION_DIR, folder_name(device))
        self.pid = pid
        self.since: float | None = None
        self.until: float | None = None
        self.done = False
        self.next = 0.0

    @property
    def seconds(self) -> float:
        if self.since is None or self.until is None:
            return 0.0
        return max(0.0, self.until - self.since)

    def look(self) -> None:
        if self.done or time.monotonic() < self.next:
            return
        self.next = time.monotonic() + LOOK_S
        waiting = self._created("queue")
        if waiting:
            self.since = self.since or min(waiting)
            self.until = time.time()  # the least it waited, if its claim is never seen
        elif self.since is not None:  # its ticket is gone: admitted (its claim) or gave up
            admitted = self._created("claims")
            if admitted:
                self.until = min(admitted)
            self.done = True

    def _created(self, section: str) -> list[float]:
        try:
            parts = (*self.parts, section)
            with _flock.open_dir(_config.ledger_dir(), parts, create=False) as fd:
                seen = _records.scan(fd)
        except (OSError, LedgerError):
            return []
        return [
            float(s.data["created"])
            for s in seen
            if s.alive and s.owner == os.geteuid() and s.data and s.data.get("pid") == self.pid
        ]


def _wait(proc: subprocess.Popen[bytes], stop: _Stop, grace: float, waited: _Waited) -> int:
    sent_term = False
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        waited.look()
        if stop.asked is None:
            continue
        if not sent_term:
            _signal_group(proc.pid, signal.SIGTERM)
            sent_term = True
        elif time.monotonic() - stop.asked > grace:
            _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


if __name__ == "__main__":
    sys.exit(main())
