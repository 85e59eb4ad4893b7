"""One packed job: its process, its JSON-lines reports read live, and why it ended.

Reports arrive on stdout (one JSON object per line, key "event": start, progress, epoch, done,
error; see experiments/mnist/README.md). Each is stamped with its arrival time and handed to the
engine's queue at once. stderr goes to a log file, whose tail is kept for the report.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from memgov._base import signals as _signals
from memgov.pack.runners import Runner

REASONS = (
    "oom",
    "cuda_error",
    "contexts",
    "mps_clients",
    "budget_refused",
    "host_memory",
    "killed",
    "timeout",
    "interrupted",
    "error",
)
"""Why a job failed: out of memory, another CUDA error, the GPU created no more CUDA contexts
(CUDA's "out of memory" before the job started, or the ledger's context limit), its MPS server
took no more clients, its claim was refused, the host had no memory for it (never started, see
hostmem.py), it was killed by a signal (not pack's), pack stopped it at --timeout or on Ctrl-C,
anything else."""
CONTEXT_WALL = "cuda error: out of memory"
"""CUDA's words when a new context cannot be created (seen on the H200 with most memory free);
an allocation that does not fit says "CUDA out of memory. Tried to allocate" instead."""
MPS_FULL = "busy or unavailable"
"""CUDA's words for a client its MPS server does not admit ("all CUDA-capable devices are busy
or unavailable")."""
TAIL_LINES = 40


@dataclass
class JobSpec:
    index: int
    label: str
    argv: list[str]
    env: dict[str, str]
    rogue_mib: int = 0


@dataclass
class Job:
    spec: JobSpec
    events: list[dict[str, Any]] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    container: str | None = None
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    stopped_by: str | None = None
    """"timeout" or "interrupted" once pack has begun to stop the job."""
    garbage: int = 0
    """stdout lines that were not JSON reports."""
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES)
    )
    log: Path | None = None
    refusal: str | None = None
    """Why pack did not start it (host memory), in words."""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.ended is None

    def start(
        self,
        runner: Runner,
        cwd: Path,
        base_env: dict[str, str],
        log_dir: Path,
        inbox: queue.Queue[tuple[str, str, dict[str, Any]]],
        t0: float,
        cpus: set[int] | None = None,
    ) -> None:
        argv, env, self.container = runner.launch(
            self.spec.argv, self.spec.env, cwd, self.spec.label, base_env
        )
        self.log = log_dir / f"{self.spec.label}.stderr"
        err = open(self.log, "wb")  # noqa: SIM115 (closed by the stderr pump)

        def pin() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        # Started, recorded and read in one step: Ctrl-C inside Popen, after its fork, would
        # leave a job running that pack does not know it started (so never stops), and one
        # between the start and its readers a job whose end pack never sees.
        with _signals.deferred():
            try:
                self.proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=pin if cpus else None,
                )
            except OSError:
                err.close()
                raise
            self.started = time.monotonic() - t0
            label = self.spec.label
            threading.Thread(
                target=self._pump_err, args=(err,), daemon=True, name=f"{label}-stderr"
            ).start()
            threading.Thread(
                target=self._pump_out, args=(inbox, t0), daemon=True, name=f"{label}-stdout"
            ).start()

    def _pump_out(self, inbox: queue.Queue[tuple[str, str, dict[str, Any]]], t0: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        label = self.spec.label
        with self.proc.stdout:
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    event = None
                if not isinstance(event, dict) or not isinstance(event.get("event"), str):
                    self.garbage += 1
                    self.tail.append(f"[stdout, not a report] {line[:300]}")
                    continue
                event["t"] = round(time.monotonic() - t0, 4)
                self.events.append(event)
                inbox.put(("event", label, event))
        self.returncode = self.proc.wait()
        self.ended = time.monotonic() - t0
        inbox.put(("exit", label, {"returncode": self.returncode}))

    def _pump_err(self, err: IO[bytes]) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with err, self.proc.stderr:
            for raw in self.proc.stderr:
                err.write(raw)
                self.tail.append(raw.decode("utf-8", errors="replace").rstrip()[:500])

    def stop(self, runner: Runner, why: str, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.ended is not None:
            return
        self.stopped_by = self.stopped_by or why
        runner.stop(self.proc.pid, self.container, sig)

    def wait_ended(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.running

    def first(self, name: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == name), None)

    def outcome(self, runner: Runner) -> tuple[str, str | None, str | None, int | None, int | None]:
        """(status, reason, detail, exit code, signal): status is ok, failed or not_started."""
        if self.proc is None:
            if self.stopped_by == "host_memory":
                return "failed", "host_memory", self.refusal, None, None
            why = "pack stopped before this job started"
            return "not_started", self.stopped_by, why, None, None
        code, sig = (None, None) if self.returncode is None else runner.decode_exit(self.returncode)
        reason, detail = classify(self.events, code, sig, list(self.tail), self.stopped_by)
        return ("ok" if reason is None else "failed"), reason, detail, code, sig


def classify(
    events: list[dict[str, Any]],
    code: int | None,
    sig: int | None,
    tail: list[str],
    stopped_by: str | None,
) -> tuple[str | None, str | None]:
    """(reason, detail) for a finished job; (None, None) when it succeeded."""
    error = next((e for e in events if e.get("event") == "error"), None)
    done = any(e.get("event") == "done" for e in events)
    stderr = "\n".join(tail)
    if code == 0 and done and error is None:
        return None, None
    started = any(e.get("event") == "start" for e in events)
    if error is not None:
        full = str(error.get("message", ""))
        message = headline(full)
        if "BudgetExceeded" in full:
            if "CUDA context limit" in full:
                return "contexts", message
            return "budget_refused", budget_line(full)
        if not started and CONTEXT_WALL in full.lower():
            return "contexts", (
                f"no CUDA context at start-up (the GPU's context limit: "
                f"{message}); run fewer jobs at once (--parallel) or use MPS"
            )
        if not started and MPS_FULL in full.lower():
            return "mps_clients", (
                f"the MPS server admitted no more clients ({message}); run "
                "fewer jobs at once (--parallel) or more daemons "
                "(--mps-daemons)"
            )
        kind = error.get("kind")
        if kind == "oom":
            return "oom", message
        if kind == "cuda":
            return "cuda_error", message
        if "BudgetExceeded" in stderr:
            return "budget_refused", budget_line(_line_with(tail, "BudgetExceeded") or full)
        return "error", message
    if stopped_by is not None:
        what = "--timeout" if stopped_by == "timeout" else "Ctrl-C or a signal to pack"
        return stopped_by, f"stopped by pack ({what})"
    if sig is not None:
        name = _signal_name(sig)
        hint = " (the host's OOM killer sends SIGKILL too)" if sig == signal.SIGKILL else ""
        return "killed", f"killed by {name}{hint}"
    if "BudgetExceeded" in stderr:
        return "budget_refused", budget_line(_line_with(tail, "BudgetExceeded") or "")
    if code == 3:
        return "oom", "exit code 3 (out of memory) without an error report"
    if code == 4:
        return "cuda_error", "exit code 4 (CUDA error) without an error report"
    last = next((line for line in reversed(tail) if line.strip()), "no output on stderr")
    if code == 0:
        return "error", f"exited 0 without a done report; stderr: {last}"
    return "error", f"exit code {code}; stderr: {last}{_install_hint(tail)}"


def _install_hint(tail: list[str]) -> str:
    """How to install the framework the job could not import, where memgov's extras have it
    (its adapter's facts)."""
    from memgov import _adapters

    facts = _adapters.facts()
    for line in reversed(tail):
        _, found, name = line.partition("ModuleNotFoundError: No module named ")
        module = name.strip().strip("'\"").split(".")[0]
        extra = facts[module].extra if found and module in facts else None
        if extra:
            return f' (pip install "memgov-gpu[{extra}]" installs {module})'
    return ""


def headline(message: str, limit: int = 300) -> str:
    """A failure's first line, for the report's one-line detail: a CUDA error's text carries the
    C++ frames of where it was raised (40 lines), which belong in the job's log, not here."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 3].rsplit(" ", 1)[0] + " ..."


def budget_line(message: str) -> str:
    """A budget refusal's line, whole (its end says what to do), in pack's terms: the claim's own
    advice names the API's ``wait=``, and a packed job queues for its budget with --wait."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    said, api, _rest = first.partition("; pass wait=SECONDS")
    return said + ("; pass --wait SECONDS to queue each job for its budget" if api else "")


def _line_with(tail: list[str], text: str) -> str | None:
    return next((line for line in reversed(tail) if text in line), None)


def _signal_name(sig: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(sig).name
    return f"signal {sig}"
