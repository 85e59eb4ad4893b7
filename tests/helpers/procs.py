"""Drive claimer.py children and watch a device's ledger from the test process."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memgov._gpu.devices import devices
from memgov._ledger.ledger import DeviceLedger, Snapshot

HELPERS = Path(__file__).resolve().parent
CLAIMER = HELPERS / "claimer.py"
PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
"""A child pytest session's command: quiet, no cache written into the repository."""


def run_memgov(
    *argv: str, env: dict[str, str], timeout: float, **run: Any
) -> subprocess.CompletedProcess[str]:
    """``python -m memgov ARGV`` with exactly ``env``, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "memgov", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **run,
    )


def memgov_without(module: str) -> str:
    """A ``python -c`` program: memgov's command line (the arguments after the program) where
    ``module`` cannot be imported, as on a machine without it."""
    return f"""
import importlib.abc, sys


class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r} or name.startswith({module + "."!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Hide())
from memgov.cli import main
sys.argv = ["memgov", *sys.argv[1:]]
main()
"""


class Child:
    """A claimer.py process; its stdout events are read by a thread so no read ever blocks."""

    def __init__(self, args: Sequence[str], prefix: Sequence[str] = (), **popen: Any) -> None:
        env = dict(os.environ)
        env.pop("MEMGOV_HOLDER", None)
        env.update(popen.pop("env", {}))
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, str(CLAIMER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: close() also ends forked children
            **popen,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                self.events.put({"event": "garbled", "line": line})
        self.events.put({"event": "exited"})

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def next(self, timeout: float = 30.0) -> dict[str, Any]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event from pid {self.proc.pid} in {timeout} s") from None

    def expect(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        got = self.next(timeout)
        if got["event"] != event:
            time.sleep(0.2)  # let stderr arrive for the message
            raise AssertionError(f"expected {event!r}, got {got}; stderr: {''.join(self.stderr)}")
        return got

    def release(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write("release\n")
            self.proc.stdin.flush()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Kill the child and everything it forked; the reader threads end at EOF."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def terminate(proc: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM a process still running, SIGKILL it if it has not ended ``timeout`` s later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ledger(uuid: str = "sim0") -> DeviceLedger:
    return DeviceLedger(next(d for d in devices() if d.uuid == uuid))


class Monitor(threading.Thread):
    """Samples a device's ledger under its admission lock; records every over-commit it sees."""

    def __init__(self, uuid: str = "sim0", period: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.ledger = ledger(uuid)
        self.period = period
        self.samples = 0
        self.max_claimed = 0
        self.max_claims = 0
        self.max_queue = 0
        self.violations: list[str] = []
        self._done = threading.Event()

    def sample(self) -> Snapshot:
        with self.ledger.locked():
            snap = self.ledger.scan(clean=False)
        self.samples += 1
        self.max_claimed = max(self.max_claimed, snap.claimed)
        self.max_claims = max(self.max_claims, len(snap.claims))
        self.max_queue = max(self.max_queue, len(snap.queue))
        if snap.claimed + snap.outside > snap.capacity:
            self.violations.append(
                f"claimed {snap.claimed} + outside {snap.outside} > capacity {snap.capacity}"
            )
        return snap

    def run(self) -> None:
        while not self._done.is_set():
            self.sample()
            time.sleep(self.period)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def wait_until(predicate: Any, timeout: float = 10.0, period: float = 0.01) -> float:
    """Poll ``predicate`` until true; return the seconds it took (AssertionError on timeout)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met in {timeout} s")
        time.sleep(period)
    return time.monotonic() - start
