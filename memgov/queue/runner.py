"""The runner: starts queued jobs where the policy places them, follows them to their end.

It is the queue's front end of the engine (memgov/queue/engine.py, the loop memgov pack runs
too): it gives the engine the ready jobs and the GPUs' free budgets from the ledger, launches
each placed attempt under a shepherd, and follows attempts through the store.

One runner per user at a time (its record in the store is flock-held for its life). Each start
is an attempt, written to the job's file *before* its shepherd starts (memgov/queue/shepherd.py),
so a runner killed at any moment leaves the store saying what runs. A restarted runner adopts
what the store says runs:

- the attempt's result is there: it ended; folded in as if the runner had seen it end;
- its live record is held: its shepherd runs it still; the runner waits for its result;
- its live record is gone or unheld and there is no result: if the shepherd never reached the
  point where it starts the command (``phase: launching`` or ``created``, or no live record at
  all), the command provably never ran and the job is queued again; otherwise it is ``failed``
  with end ``lost`` (the shepherd was killed while the command ran: whether it finished is
  unknown, so it is not run a second time; `memgov queue log ID` shows its output), and what is
  left of the command's process group is killed.

The record is made and locked by the runner before the shepherd exists, and the shepherd
inherits the lock (:meth:`Runner._start`): an unheld record proves no shepherd of the attempt
can still start, so no attempt is ever queued again while its first shepherd is only slow.

Stopping (Ctrl-C, SIGTERM, SIGHUP to the runner): every shepherd gets SIGTERM and passes it to
its command, SIGKILL after the grace period; each attempt's result is saved and the jobs that
did not finish are queued again (end ``stopped``), to run at the next `memgov queue run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from memgov import _run, decide
from memgov._base import signals as _signals
from memgov._base.errors import MemgovError, QueueError
from memgov._base.sizes import Size
from memgov._gpu import devices as _devices
from memgov._gpu.devices import Device
from memgov._ledger.ledger import DeviceLedger, new_record_name
from memgov._profiles import autosize as _autosize
from memgov.queue import ends
from memgov.queue.engine import Engine
from memgov.queue.model import FINISHED, Attempt, Job
from memgov.queue.report import Report, Sampler, build_report
from memgov.queue.shepherd import LAUNCHING, live_payload, shepherd_pid
from memgov.queue.store import Store

POLL_S = 0.1
REFRESH_S = 0.5
"""How often the store is read again (new jobs, cancels)."""
CHECK_S = 1.0
"""How often a running attempt's shepherd is checked for life (its result is looked for at
every poll)."""
DECIDE_EVERY_S = 1.0
"""Without any event (a job ended, arrived or was added), the policy is asked again this often:
the time a reservation waits for passes."""
WAIT_BUDGET_S = 600
"""MEMGOV_WAIT of each job: a claim that meets a neighbour outside the queue waits for it."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Options:
    policy: str | None = None
    max_slowdown: float | None = None
    """memgov's bound on a job's slowdown beside others (``--max-slowdown``); None: none."""
    grace_s: float = 10.0
    serve: bool = False
    batch: str | None = None
    """Run only the jobs of this batch (a queue file's run); None: every queued job."""
    solo: dict[str, float] = field(default_factory=dict)
    """Job name -> its solo run time (``--solo REPORT.json``)."""
    what: str = "memgov queue run"


@dataclass
class Tracked:
    """A running attempt the runner follows."""

    job: Job
    attempt: Attempt
    proc: subprocess.Popen[bytes] | None
    shepherd_pid: int | None
    checked: float = 0.0


class _Stop:
    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signum


class Runner:
    def __init__(self, options: Options, store: Store | None = None) -> None:
        self.options = options
        self.store = store or Store()
        self.policy = decide.get(options.policy, options.max_slowdown)
        self.devices = _devices.candidates("auto")
        self.tracked: dict[int, Tracked] = {}
        self.jobs: dict[int, Job] = {}
        self.learned = decide.Learned.from_json(self.store.read_extra("learned.json"))
        self.sizes: dict[int, _autosize.Sized] = {}
        self.engine = Engine(self, self.policy)
        """The loop that decides, launches and follows (memgov/queue/engine.py): this runner is
        its front end, launching each attempt under a shepherd and following it in the store."""
        self.latencies = self.engine.latencies
        self.timeline: list[tuple[int, str, int, float, float | None]] = []
        """(job id, kind, gpu, start, end) of every attempt seen: the co-location record."""
        self.stop = _Stop()
        self.sampler = Sampler(self.devices)
        self.changed = True
        self.problems: list[str] = []
        self.last_decision = 0.0
        self.last_refresh = 0.0
        self.touched: set[int] = set()
        """Jobs this runner started, adopted or failed: the report of a run without a file."""

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> Report:
        held = self.store.hold_runner(
            {
                "version": 1,
                "id": new_record_name(),
                "kind": "queue-runner",
                "device": "-",
                "bytes": 1,
                "name": self.options.what,
                "pid": os.getpid(),
                "created": time.time(),
                "what": self.options.what,
            }
        )
        saved = {sig: signal.signal(sig, self.stop) for sig in STOP_SIGNALS}
        started = time.time()
        try:
            self._refresh()
            self._adopt()
            self.last_refresh = time.monotonic()
            self.engine.run(lambda: self.stop.signal is not None)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
            self.store.release_runner(held)
        return self._report(started)

    # -- the engine's front end (memgov/queue/engine.py) ------------------------------------------

    def follow(self) -> bool:
        """New jobs and cancels from the store, the attempts that ended; whether any is left."""
        if time.monotonic() - self.last_refresh >= REFRESH_S:
            self._refresh()
            self.last_refresh = time.monotonic()
        self._reap()
        return self.options.serve or self._pending()

    def wait(self) -> None:
        self.sampler.maybe(self._queue_bytes())
        time.sleep(POLL_S)

    def halt(self, error: BaseException | None) -> None:
        """Stopped by a signal: every shepherd stops its command, each attempt's result is
        saved. On a bug (``error``) the shepherds run on: the next runner adopts them."""
        if error is None:
            self._stop_all()

    def view(self, now: float) -> tuple[list[decide.Candidate], list[decide.Gpu]] | None:
        """The ready jobs of this run and the GPUs, when a decision is due: something changed
        (a job ended, arrived or was added), an arrival time came, or DECIDE_EVERY_S passed."""
        ready = [
            j
            for j in self.jobs.values()
            if j.state == "queued" and self._scope(j) and j.not_before <= now
        ]
        again = time.monotonic() - self.last_decision >= DECIDE_EVERY_S
        if not ready or not (self.changed or again or self._arrivals_due(now)):
            return None
        self.changed = False
        self.last_decision = time.monotonic()
        return self._view(ready, now)

    def start(self, job_id: int, gpu: int, claim: int) -> None:
        self._start(self.jobs[job_id], self.devices[gpu], claim)

    def refuse(self, job_id: int, why: str) -> None:
        self._never(self.jobs[job_id], why)

    def held(self, waiting: list[decide.Candidate]) -> None:
        """Jobs that wait are simply queued still."""

    def active(self) -> int:
        return len(self.tracked)

    def _scope(self, job: Job) -> bool:
        return self.options.batch is None or job.batch == self.options.batch

    def _pending(self) -> bool:
        return bool(self.tracked) or any(
            j.state == "queued" and self._scope(j) for j in self.jobs.values()
        )

    def _refresh(self) -> None:
        jobs, problems = self.store.jobs()
        self.problems = problems
        for job in jobs:
            old = self.jobs.get(job.id)
            if old is None or old.state != job.state or old.cancel != job.cancel:
                self.changed = True
            self.jobs[job.id] = job
            tracked = self.tracked.get(job.id)
            if tracked is not None:
                tracked.job = job
                if job.cancel:
                    self._signal(tracked, signal.SIGTERM)

    # -- deciding -------------------------------------------------------------------------------

    def _arrivals_due(self, now: float) -> bool:
        due = [j.not_before for j in self.jobs.values() if j.state == "queued" and self._scope(j)]
        return any(now - POLL_S * 2 <= t <= now for t in due)

    def _view(
        self, ready: list[Job], now: float
    ) -> tuple[list[decide.Candidate], list[decide.Gpu]]:
        gpus = self._gpus(now)
        candidates = []
        for job in sorted(ready, key=lambda j: (j.not_before, j.id)):
            claim = self._placeable(job, gpus)
            if claim is None:
                continue
            expected = self.learned.expected(job.job, job.kind, job.duration)
            util = self.learned.util.get(job.job, 1.0)
            candidates.append(
                decide.Candidate(job.id, job.kind, claim, expected, job.gpu, util, job.not_before)
            )
        return candidates, gpus

    def _gpus(self, now: float) -> list[decide.Gpu]:
        children = self._children()
        me = os.geteuid()
        gpus = []
        for device in self.devices:
            snap = DeviceLedger(device).snapshot()
            # Only this user's records count as its children's: a pid is no proof of whose
            # record it is (anyone may write a record naming any pid, e.g. one of these).
            mine = sum(c.bytes for c in snap.claims if c.pid in children and c.uid == me)
            running = [t for t in self.tracked.values() if t.attempt.gpu == device.index]
            placed = sum(t.attempt.claim_bytes for t in running)
            free = max(0, snap.free + mine - placed)
            gpus.append(
                decide.Gpu(
                    device.index,
                    snap.capacity,
                    free,
                    [
                        decide.Running(
                            t.job.id,
                            t.job.kind,
                            t.attempt.claim_bytes,
                            t.attempt.start,
                            self.learned.expected(t.job.job, t.job.kind, t.job.duration),
                            self.learned.util.get(t.job.job, 1.0),
                        )
                        for t in running
                    ],
                )
            )
        return gpus

    def _children(self) -> set[int]:
        """The pids of the commands the queue runs (their claims are counted in the queue's)."""
        if not self.tracked:
            return set()
        live = self.store.live_records()
        pids = set()
        for tracked in self.tracked.values():
            _alive, data = live.get(tracked.attempt.live, (False, None))
            child = (data or {}).get("child")
            if isinstance(child, int):
                pids.add(child)
        return pids

    def _placeable(self, job: Job, gpus: list[decide.Gpu]) -> int | None:
        """The job's claim; None (and the job failed, saying why) when no GPU can ever hold it."""
        try:
            if job.gpu is not None and not 0 <= job.gpu < len(self.devices):
                raise QueueError(f"gpu {job.gpu}: this host has GPUs 0..{len(self.devices) - 1}")
            claim = self._claim(job)
            room = max(g.capacity for g in gpus if job.gpu is None or g.index == job.gpu)
            if claim > room:
                raise QueueError(
                    f"claim {claim / 2**30:.2f} GiB is more than any GPU it may use holds "
                    f"({room / 2**30:.2f} GiB of budget)"
                )
            return claim
        except MemgovError as exc:
            self._never(job, str(exc))
            return None

    def _never(self, job: Job, why: str) -> None:
        now = time.time()
        self.jobs[job.id] = self.store.update(job.id, lambda stored: ends.never(stored, why, now))
        self.touched.add(job.id)
        self.changed = True

    def _claim(self, job: Job) -> int:
        """The bytes the job's next attempt claims."""
        if isinstance(job.claim, int):
            return job.claim
        if job.claim != "auto":
            return Size(job.claim, "claim").on(max(d.total for d in self.devices))
        if job.id not in self.sizes:
            device = self.devices[job.gpu] if job.gpu is not None else self.devices[0]
            self.sizes[job.id] = _autosize.size_for(device, job.job, job.name)
        sized = self.sizes[job.id]
        if job.next_claim:  # after an OOM: grown, or the peak a sibling's run taught since
            return max(job.next_claim, sized.bytes) if sized.kind == "profile" else job.next_claim
        return sized.bytes

    # -- starting -------------------------------------------------------------------------------

    def _start(self, job: Job, device: Device, claim: int) -> None:
        attempt = Attempt(
            len(job.attempts) + 1,
            claim,
            device.index,
            device.uuid,
            new_record_name(),
            start=time.time(),
        )

        def begin(stored: Job) -> None:
            if stored.state == "queued":  # not cancelled since the runner last read it
                stored.state = "running"
                stored.attempts.append(attempt)
                stored.attempts[-1].n = len(stored.attempts)

        job = self.store.update(job.id, begin)  # written before anything starts
        self.jobs[job.id] = job
        if job.last is None or job.last.live != attempt.live:
            self.changed = True
            return
        attempt = job.last
        orders = self._orders(job, attempt, device)
        # The start handshake: the attempt's live record is made and flock-held here, before
        # its shepherd exists, and the shepherd inherits the locked descriptor. The lock is
        # held without a gap from now until the shepherd ends (by this runner until the fork,
        # by both until the close below, then by the shepherd): an unheld record proves that
        # no shepherd of this attempt runs or can still start, however slowly its interpreter
        # comes up on a loaded host. Only then does a runner queue the job again.
        held = self.store.start_live(attempt.live, live_payload(orders, LAUNCHING))
        orders["live_fd"] = held.file.fileno()
        try:
            # Started and tracked in one step: Ctrl-C inside Popen, after its fork, would leave
            # a shepherd running that this runner never stops.
            with _signals.deferred():
                proc = subprocess.Popen(
                    [sys.executable, "-m", "memgov.queue.shepherd"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C on the terminal reaches the runner
                    env={**os.environ, "PYTHONPATH": _python_path()},
                    pass_fds=(held.file.fileno(),),
                )
                self.tracked[job.id] = Tracked(job, attempt, proc, proc.pid, time.monotonic())
        finally:
            held.file.close()  # the shepherd's copy holds the lock now (none started: unheld)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(orders).encode())
        proc.stdin.close()
        self.touched.add(job.id)
        self.timeline.append((job.id, job.kind, device.index, attempt.start, None))
        self.sizes.pop(job.id, None)

    def _orders(self, job: Job, attempt: Attempt, device: Device) -> dict[str, Any]:
        env = _run.command_env(
            str(attempt.claim_bytes),
            device.uuid,
            WAIT_BUDGET_S,
            False,
            None,
            environ=job.env,
            job=job.job,
        )
        for name in ("MEMGOV_DIR", "MEMGOV_DEVICES"):
            if name in os.environ:
                env[name] = os.environ[name]  # the ledger and GPUs the runner placed it on
            else:
                env.pop(name, None)
        if not device.simulated:
            env["CUDA_VISIBLE_DEVICES"] = device.uuid
        return {
            "id": job.id,
            "attempt": attempt.n,
            "live": attempt.live,
            "cmd": job.cmd,
            "cwd": job.cwd,
            "env": env,
            "grace": self.options.grace_s,
            "device": device.uuid,
            "gpu": device.index,
            "bytes": attempt.claim_bytes,
            "name": job.name,
        }

    # -- following ------------------------------------------------------------------------------

    def _reap(self) -> None:
        due = {i for i, t in self.tracked.items() if time.monotonic() - t.checked >= CHECK_S}
        live = self.store.live_records() if due else {}  # one scan, before the results
        for tracked in list(self.tracked.values()):
            if tracked.proc is not None:
                tracked.proc.poll()  # no zombie shepherds
            result = self.store.read_result(tracked.job.id, tracked.attempt.n)
            if result is not None:
                self._finish(tracked, result)
            elif tracked.job.id in due:
                tracked.checked = time.monotonic()
                self._check_alive(tracked, live)

    def _check_alive(
        self, tracked: Tracked, live: dict[str, tuple[bool, dict[str, Any] | None]]
    ) -> None:
        """``live``: the live records, read before this attempt's result was looked for (a
        shepherd writes its result before it releases its record)."""
        exists = tracked.attempt.live in live
        alive, data = live.get(tracked.attempt.live, (False, None))
        if alive:
            return
        if self.store.read_result(tracked.job.id, tracked.attempt.n) is not None:
            return  # ended between the two looks: reaped at the next poll
        if ends.unheld(exists, data) == "not_started":
            self._finish(tracked, {"not_started": True, "end": time.time()})
        else:
            # The command was made to die with its shepherd (memgov/queue/shepherd.py); what
            # it started in its process group goes too: nothing of a lost attempt runs on,
            # holding its claim, where no cancel reaches it. (A group outlives no member, so
            # while it exists the id is still that group's.)
            child = (data or {}).get("child")
            if isinstance(child, int) and child > 1:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child, signal.SIGKILL)
            self._finish(
                tracked,
                {
                    "lost": True,
                    "end": time.time(),
                    "detail": "its shepherd died while the command ran",
                },
            )

    def _adopt(self) -> None:
        """Follow the attempts a previous runner started (module docstring)."""
        for job in list(self.jobs.values()):
            if job.state != "running" or job.last is None:
                continue
            _exists, _alive, data = self.store.live(job.last.live)
            tracked = Tracked(job, job.last, None, shepherd_pid(data), 0.0)
            self.tracked[job.id] = tracked
            self.touched.add(job.id)
            self.timeline.append((job.id, job.kind, job.last.gpu, job.last.start, None))
        self._reap()

    def _signal(self, tracked: Tracked, sig: int) -> None:
        if tracked.proc is not None:
            if tracked.proc.poll() is None:
                tracked.proc.send_signal(sig)
            return
        _exists, alive, data = self.store.live(tracked.attempt.live)
        pid = shepherd_pid(data)
        if alive and pid is not None:  # held: the pid is still that shepherd's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _stop_all(self) -> None:
        for tracked in self.tracked.values():
            self._signal(tracked, signal.SIGTERM)
        deadline = time.monotonic() + self.options.grace_s + 10
        while self.tracked and time.monotonic() < deadline:
            self._reap()
            time.sleep(POLL_S)
        for tracked in list(self.tracked.values()):  # a shepherd that ignored SIGTERM
            self._signal(tracked, signal.SIGKILL)
        if self.tracked:
            time.sleep(POLL_S)
            live = self.store.live_records()
            for tracked in list(self.tracked.values()):
                self._check_alive(tracked, live)

    # -- ends -----------------------------------------------------------------------------------

    def _finish(self, tracked: Tracked, result: dict[str, Any]) -> None:
        job, attempt = tracked.job, tracked.attempt
        end = float(result.get("end") or time.time())
        attempt.end = end
        attempt.returncode = result.get("returncode")
        attempt.pid = result.get("pid")
        # A wait of its claim in the ledger (behind a neighbour) is not run time: the job's
        # run, and the solo time learned from it, begin when its claim was admitted.
        waited = result.get("waited")
        attempt.start = float(result.get("start") or attempt.start) + (
            float(waited) if isinstance(waited, (int, float)) and waited > 0 else 0.0
        )
        attempt.result, attempt.detail = self._classify(job, result)
        attempt.peak_bytes = ends.peak_of(ends.profile_run(job.job, attempt.pid))
        ends.learn_from(self.learned, job, attempt, self.timeline, self.options.solo)
        if attempt.result == "ok":
            self.store.write_extra("learned.json", self.learned.to_json())
        fresh = self.store.update(job.id, lambda stored: ends.settle(stored, attempt))
        self.jobs[job.id] = fresh
        self.store.drop_result(job.id, attempt.n)
        self.store.drop_live(attempt.live)
        self.tracked.pop(job.id, None)
        self.timeline = [
            (i, k, g, s, end if i == job.id and e is None else e) for i, k, g, s, e in self.timeline
        ]
        for other in self.jobs.values():  # its new profile run sizes the same job differently
            if other.job == job.job:
                self.sizes.pop(other.id, None)
        self.changed = True

    def _classify(self, job: Job, result: dict[str, Any]) -> tuple[str, str]:
        if result.get("not_started"):
            return "not_started", "its shepherd ended before starting it: queued again"
        if result.get("lost") or result.get("unreadable"):
            return "lost", str(result.get("detail", ""))
        code = result.get("returncode")
        if result.get("stopped") and code != 0:
            if job.cancel:
                return "cancelled", "memgov queue cancel"
            return "stopped", "the runner stopped: queued again"
        detail = str(result.get("detail") or "")
        return ends.by_exit(code, lambda: self._ran_out(job, result), detail)

    def _ran_out(self, job: Job, result: dict[str, Any]) -> bool:
        tail, size = self.store.read_log(job.id, 16 * 1024)
        at = result.get("output_at")  # the shepherd's; anything else: the whole tail is read
        banner = (at if isinstance(at, int) else 0) - (size - len(tail))
        tail = tail[max(0, banner) :]  # the command's output only, not the banner naming it
        run = ends.profile_run(job.job, result.get("pid"))
        return ends.ran_out(run, tail.decode(errors="replace"))

    def _queue_bytes(self) -> dict[int, int]:
        placed: dict[int, int] = {}
        for tracked in self.tracked.values():
            gpu = tracked.attempt.gpu
            placed[gpu] = placed.get(gpu, 0) + tracked.attempt.claim_bytes
        return placed

    def _report(self, started: float) -> Report:
        mine = (lambda j: j.id in self.touched) if self.options.batch is None else self._scope
        jobs = [j for j in self.jobs.values() if mine(j) and j.attempts]
        report = build_report(
            self.policy,
            jobs,
            self.latencies,
            self.sampler,
            self.devices,
            self.options.solo,
            self.learned,
            started,
            started if self.options.batch is None else None,
            held=(self.engine.held, self.engine.held_count),
        )
        report.interrupted = self.stop.signal
        return report


def _python_path() -> str:
    """The shepherd imports this memgov, wherever it is installed or checked out."""
    import memgov

    here = os.path.dirname(os.path.dirname(os.path.abspath(memgov.__file__)))
    rest = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + rest if rest else "")


def finished(job: Job) -> bool:
    return job.state in FINISHED


__all__ = ["Options", "QueueError", "Runner", "finished"]
