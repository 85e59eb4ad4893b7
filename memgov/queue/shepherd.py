"""One attempt of one queued job: ``python -m memgov.queue.shepherd`` (started by the runner).

The shepherd is what makes a runner's death harmless. It reads its orders (command, folder,
environment, log) on stdin, then:

1. holds the attempt's *live record* (``live/<name>.json``, flock-held for its life:
   memgov/_records.py), first with ``phase: created``;
2. rewrites it with ``phase: starting`` just before it starts the command: a live record that
   died still at ``created`` proves the command never started (the job is queued again);
3. starts the command in its own session (its output appended to the job's log), records its
   pid (``phase: started``) and waits for it;
4. on SIGTERM, SIGINT or SIGHUP: SIGTERM to the command's process group, SIGKILL after the
   grace period;
5. writes the attempt's result (``results/<job>-<attempt>.json``: exit status, times, whether
   it was stopped) and only then releases its live record.

It runs in a session of its own: a runner killed with SIGKILL leaves it (and the command)
running; the next runner finds the live record held and waits for the result. Only a shepherd
killed between 3 and 5 leaves no result: the job is then ``lost`` (it may have finished).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from memgov.queue.store import Store

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


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
    held = store.start_live(orders["live"], live_payload(orders, "created"))
    log = store.open_log(orders["id"])
    started = time.time()
    result: dict[str, Any] = {"start": started, "pid": None, "returncode": None}
    try:
        if stop.asked is None:
            store.update_live(held, live_payload(orders, "starting"))
            _banner(log, orders)
            result["start"] = time.time()  # the command's own time, not the shepherd's start-up
            proc = _start(orders, log)
            result["pid"] = proc.pid
            store.update_live(held, live_payload(orders, "started", child=proc.pid))
            result["returncode"] = _wait(proc, stop, float(orders.get("grace", 10)))
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
    )


def _wait(proc: subprocess.Popen[bytes], stop: _Stop, grace: float) -> int:
    sent_term = False
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
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
