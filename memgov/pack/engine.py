"""pack's front end of the engine: N copies of an experiment on one GPU, watched, reported.

A pack is a list of runs: the naive baseline (``--baseline naive``), the one-job reference
(solo), then one run per job count (``--n`` or each ``--sweep`` value). Each run is a workload
of identical copies handed to the engine that runs memgov queue too (memgov/queue/engine.py):
its ``fifo`` policy starts copies first fit, as pack's two gates admit them (:class:`Slots`:
at most ``parallel`` at once, the rest start as others finish; :class:`HostRoom`: the host's
memory, hostmem.py), and :class:`OneRun` launches them with pack's runner, reads their reports
live, samples footprints, and ends with a record (stats.py); results.py files it in the report.
An MPS daemon that pack starts (memgov._gpu.mps) runs around the governed runs and is stopped in a
``finally``: also on Ctrl-C, SIGTERM or SIGHUP (all turned into exceptions here), after the
jobs have been stopped.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from memgov import decide
from memgov._base import config as _config
from memgov._base.signals import raise_on_signals
from memgov.decide import Candidate, Gpu
from memgov.decide.learn import Learned
from memgov.pack import hostmem, stats, warmup
from memgov.pack.config import PackConfig, cpu_sets, threads_for
from memgov.pack.jobs import Job, JobSpec
from memgov.pack.monitor import Sampler
from memgov.pack.plan import Context, RunPlan, learn_claim, prepare
from memgov.pack.results import Results, complete_run
from memgov.pack.stats import JobRecord, RunRecord
from memgov.queue.engine import Engine

STOP_GRACE_S = 10.0
"""How long a job has after SIGTERM before SIGKILL."""


class Observer(Protocol):
    """Live progress (the CLI draws it with rich); every method is optional in practice."""

    def run_started(self, plan: RunPlan) -> None: ...
    def job_event(self, plan: RunPlan, job: str, event: dict[str, Any]) -> None: ...
    def job_ended(self, plan: RunPlan, record: JobRecord) -> None: ...
    def run_ended(self, plan: RunPlan, record: RunRecord) -> None: ...


class _Quiet:
    def run_started(self, plan: RunPlan) -> None: ...
    def job_event(self, plan: RunPlan, job: str, event: dict[str, Any]) -> None: ...
    def job_ended(self, plan: RunPlan, record: JobRecord) -> None: ...
    def run_ended(self, plan: RunPlan, record: RunRecord) -> None: ...


@dataclass
class Outcome:
    report: dict[str, Any]
    interrupted: BaseException | None


def pack(
    cfg: PackConfig,
    observer: Observer | None = None,
    write: Callable[[dict[str, Any], Path], None] | None = None,
) -> Outcome:
    """Run the pack; write its report (also a partial one after Ctrl-C) with ``write``."""
    ctx = prepare(cfg)  # every ConfigError before anything starts
    watcher = observer or _Quiet()
    results = Results(ctx)
    stop: BaseException | None = None
    with contextlib.ExitStack() as stack:
        stack.callback(raise_on_signals())  # SIGTERM/SIGHUP: SystemExit
        try:
            for plan in ctx.plans:
                if plan.mps and ctx.mps_info is None:
                    ctx.mps_info = stack.enter_context(ctx.mps_daemon())
                record, stop = run_once(ctx, plan, watcher)
                results.add_run(plan, record)
                if plan.role == "solo":
                    learn_claim(ctx, _peak(record, "footprint_mib"))
                    if ctx.host_gate is not None:
                        ctx.host_gate.learn(_peak(record, "uss_mib"))
                if stop is not None:
                    break
        except (KeyboardInterrupt, SystemExit) as exc:  # while starting the MPS daemon
            stop = exc
        finally:
            try:
                stack.close()  # the MPS daemon stops here, after every job has ended
            except (KeyboardInterrupt, SystemExit) as exc:
                stop = stop or exc
            results.finish(interrupted=stop is not None)
            if write is not None:
                write(results.report, ctx.out)
    if stop is not None and not isinstance(stop, (KeyboardInterrupt, SystemExit)):
        raise stop  # a failure of pack itself (e.g. a runner that cannot spawn): jobs ended
    return Outcome(results.report, stop)


def run_once(
    ctx: Context, plan: RunPlan, observer: Observer
) -> tuple[RunRecord, BaseException | None]:
    """Run one plan's jobs to the end (or until stopped); return its record and any interrupt."""
    run = OneRun(ctx, plan, observer)
    run.warm_up()
    observer.run_started(plan)
    run.drive()
    return run.record(), run.stop


POLICY = "fifo"
"""pack's copies start first fit, in order, as the gates admit them."""
UNBOUNDED = sys.maxsize
"""The GPU budget the engine sees for pack: each job claims inside itself (auto-enable), where
the ledger admits, refuses or (``--wait``) queues it; pack's gates bound the starts."""


class OneRun:
    """One plan's jobs, in steps: set up (the jobs, their environment), :meth:`warm_up` (JAX's
    compilation cache), :meth:`drive` (the engine starts jobs as the gates allow; the run stops
    them at the timeout and takes their reports) and :meth:`record` (what the report says of
    the run). It is the engine's front end (memgov/queue/engine.py ``Front``) for the run."""

    def __init__(self, ctx: Context, plan: RunPlan, observer: Observer) -> None:
        self.ctx, self.plan, self.observer = ctx, plan, observer
        self.concurrent = min(plan.n, plan.parallel)
        governed = plan.mode != "greedy"
        # The expected share (for --pin and the report); the jobs decide their own threads with
        # memgov's thread budget (memgov/_cpu/threads.py), unless --threads N (or a CPU pack's solo
        # job, given one packed job's threads as a fair reference) fixes them.
        self.threads = plan.threads or threads_for(ctx.cfg, self.concurrent) if governed else None
        fixed = plan.threads or ctx.cfg.threads if governed else None
        self.env = ctx.job_env(plan, fixed, ctx.mps_paths() if plan.mps else None)
        self.base = ctx.base_env(plan.mode)
        self.connections = one_connection(ctx, self.concurrent, self.base)
        if self.connections:
            self.env[CONNECTIONS_VAR] = "1"
        self.jobs = [
            Job(JobSpec(i, f"job-{i:02d}", ctx.argv(plan, i), self.env, plan.rogue_mib(i)))
            for i in range(plan.n)
        ]
        self.by_label = {j.spec.label: j for j in self.jobs}
        self.pending: deque[Job] = deque(self.jobs)
        self.running: set[str] = set()
        self.records: dict[str, JobRecord] = {}
        self.log_dir = ctx.out / "logs" / plan.label
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.sampler = Sampler(ctx.device, watch_nvml=not ctx.cpu)
        self.inbox: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
        self.stop: BaseException | None = None
        self.warm: dict[str, Any] | None = None
        self.t0 = self.t0_unix = self.wall = 0.0
        self.learned = Learned()
        self.deadline: float | None = None
        self.kill_at: float | None = None
        gates: list[decide.Gate] = [Slots(self)]
        if ctx.host_gate is not None:
            gates.append(HostRoom(ctx.host_gate, self))
        self.engine = Engine(self, decide.get(POLICY), gates)

    @property
    def cached(self) -> bool:
        """The governed jobs of this run share a compilation cache (warmup.py)."""
        return self.ctx.compile_cache is not None and self.plan.mode != "greedy"

    def warm_up(self) -> None:
        """Before the run's clock starts: the jobs then load what one job compiled."""
        ctx = self.ctx
        if not self.cached or ctx.cache_warm:
            return
        spec = JobSpec(-1, "warm-up", ctx.argv(self.plan, 0), self.env)
        try:
            self.warm = warmup.warm_up(
                spec, ctx.runner, ctx.folder, self.base, self.log_dir, ctx.cfg.timeout
            )
            ctx.cache_warm = self.warm["status"] == "warm"
        except BaseException as exc:  # Ctrl-C, SIGTERM/SIGHUP (the warm-up job is stopped)
            self.warm, self.stop = {"status": "interrupted"}, exc
            while self.pending:
                self.pending.popleft().stopped_by = "interrupted"

    def drive(self) -> None:
        """Run the jobs until every one has ended; on an interrupt (or a bug), end them all."""
        self.sampler.start()
        self.t0 = time.monotonic()
        self.t0_unix = time.time()  # the same instant on the wall clock, for outside monitoring
        self.deadline = self.t0 + self.ctx.cfg.timeout if self.ctx.cfg.timeout else None
        try:
            self.engine.run(lambda: False)
        except BaseException as exc:  # Ctrl-C, SIGTERM/SIGHUP (SystemExit), or a bug: halted
            self.stop = exc
        finally:
            self.sampler.stop()
        self.wall = time.monotonic() - self.t0

    # -- the engine's front end (memgov/queue/engine.py) ------------------------------------------

    def view(self, now: float) -> tuple[list[Candidate], list[Gpu]] | None:
        """The copies not started yet, in order, and the one GPU: its budget unbounded here
        (the ledger admits each job's claim inside the job)."""
        if not self.pending:
            return None
        claim = self.plan.claim_bytes or 0
        kind = self.ctx.manifest.name
        ready = [Candidate(j.spec.index, kind, claim, None, None) for j in self.pending]
        running = [
            decide.Running(self.by_label[label].spec.index, kind, claim, now, None)
            for label in self.running
        ]
        return ready, [Gpu(0, UNBOUNDED, UNBOUNDED, running)]

    def start(self, job_id: int, gpu: int, claim: int) -> None:
        ctx, job = self.ctx, self.jobs[job_id]
        self.pending.remove(job)
        cpus = cpu_sets(job.spec.index, self.threads or 1) if ctx.cfg.pin else None
        job.start(ctx.runner, ctx.folder, self.base, self.log_dir, self.inbox, self.t0, cpus)
        self.sampler.track(job.spec.label, _root(ctx, job), ctx.runner.host_pids)
        self.running.add(job.spec.label)
        if ctx.host_gate is not None:
            ctx.host_gate.started(len(self.running))

    def refuse(self, job_id: int, why: str) -> None:
        """The host cannot hold one job even with none of the run left: not started."""
        job = self.jobs[job_id]
        self.pending.remove(job)
        job.stopped_by, job.refusal = "host_memory", why
        if self.ctx.host_gate is not None:
            self.ctx.host_gate.refused += 1
        self.ended(job, _blank())

    def held(self, waiting: list[Candidate]) -> None:
        """The first copy waits for host memory (not for a slot): the run goes on in waves."""
        gate = self.ctx.host_gate
        if gate is not None and self.running and len(self.running) < self.plan.parallel:
            gate.deferred.add(self.jobs[waiting[0].id].spec.label)

    def active(self) -> int:
        return len(self.running)

    def halt(self, error: BaseException | None) -> None:
        """Ctrl-C, SIGTERM/SIGHUP or a bug ended the loop: end every job (SIGTERM, SIGKILL
        after the grace)."""
        _stop_all(self.ctx, self.jobs, self.pending, "interrupted")
        _reap(self.ctx, self.jobs)

    def follow(self) -> bool:
        """--timeout: SIGTERM every job at the deadline, SIGKILL after the grace; whether any
        job is left to start or running."""
        self.kill_at = self.keep_time(self.deadline, self.kill_at)
        return bool(self.pending or self.running)

    def wait(self) -> None:
        """Until a job's reader says something (0.2 s at most); then take all it said."""
        with contextlib.suppress(queue.Empty):
            self.take(*self.inbox.get(timeout=0.2))
            while True:
                self.take(*self.inbox.get_nowait())

    def keep_time(self, deadline: float | None, kill_at: float | None) -> float | None:
        """--timeout: SIGTERM every job at the deadline, SIGKILL after the grace; the new
        moment of the SIGKILL."""
        now = time.monotonic()
        if deadline is not None and now > deadline and kill_at is None:
            _stop_all(self.ctx, self.jobs, self.pending, "timeout")
            return now + STOP_GRACE_S
        if kill_at is not None and now > kill_at:
            _stop_all(self.ctx, self.jobs, self.pending, "timeout", signal.SIGKILL)
        return kill_at

    def take(self, kind: str, label: str, data: dict[str, Any]) -> None:
        """One message of a job's reader: an event of its report, or its end."""
        if kind == "event":
            self.observer.job_event(self.plan, label, data)
            return
        self.running.discard(label)
        self.sampler.untrack(label)
        self.ended(self.by_label[label], self.sampler.jobs[label])

    def ended(self, job: Job, sample: Any) -> None:
        record = stats.job_record(job, sample, self.ctx.runner)
        self.records[job.spec.label] = record
        self.observer.job_ended(self.plan, record)

    def record(self) -> RunRecord:
        """The run's record (stats.py, results.py), after cleaning up after its jobs."""
        ctx, plan = self.ctx, self.plan
        left = ctx.runner.cleanup()  # containers a stop raced with (created, never started)
        swept = _sweep_ledger(ctx)
        done = [
            self.records.get(j.spec.label)
            or stats.job_record(j, self.sampler.jobs.get(j.spec.label) or _blank(), ctx.runner)
            for j in self.jobs
        ]
        waited = ctx.host_gate is not None and bool(ctx.host_gate.deferred)  # waves: host memory
        record = stats.run_record(done, all_at_once=self.concurrent >= plan.n and not waited)
        record["started_unix"] = round(self.t0_unix, 3)
        complete_run(ctx, record, plan, self.sampler, self.threads, self.concurrent, self.wall)
        if self.cached:
            record["warm_up"] = self.warm or {
                "status": "skipped",
                "why": "the cache was already warm",
            }
            ctx.cache_warm = ctx.cache_warm or any(j.first("start") for j in self.jobs)
        if left:
            record["removed_after_run"] = left
        if swept:
            record["dead_records_removed"] = swept
        if ctx.host_gate is not None:
            record["host_gate"] = ctx.host_gate.summary()
            ctx.host_gate.reset()
        if self.connections:
            record["connections"] = self.connections
        record["decisions"] = self.engine.decisions()
        self.observer.run_ended(plan, record)
        return record


CONNECTIONS_VAR = "CUDA_DEVICE_MAX_CONNECTIONS"


def _connections_from(ctx: Context) -> int:
    """Jobs at once above which each job gets one hardware connection: the CUDA context limit
    (MEMGOV_CONTEXTS, default 72), which stays below the walls of both contexts and MPS clients.

    Each CUDA context, and each MPS client, takes 8 connections (work queues) from the GPU's
    pool by default; on an H200 the pool ran out at 101 bare contexts without MPS and at ~122
    MPS clients over three servers, with "CUDA error: out of memory" at start-up and most memory
    free (docs/hard-limits.md). A trainer that launches on one stream needs one connection (a job
    with several streams would lose their concurrency: the user's own setting wins)."""
    return ctx.context_limit or _config.DEFAULT_CONTEXTS


def one_connection(ctx: Context, concurrent: int, base: dict[str, str]) -> str | None:
    """Why this run's jobs get CUDA_DEVICE_MAX_CONNECTIONS=1, or None when they do not."""
    limit = _connections_from(ctx)
    if ctx.cpu or concurrent <= limit or CONNECTIONS_VAR in base:
        return None
    return (
        f"{CONNECTIONS_VAR}=1 for every job: {concurrent} jobs at once take more than the "
        f"GPU's pool of hardware connections at the default 8 per context or MPS client "
        f"(over {limit} jobs at once; set {CONNECTIONS_VAR} yourself to choose)"
    )


def _sweep_ledger(ctx: Context) -> list[str]:
    """Remove the claim records of this run's killed jobs (SIGKILL, SIGTERM: no exit handler
    ran). They count for nothing already (their flock died with them) and the next admission
    would remove them; removing them now leaves the ledger folder as the run found it."""
    if ctx.device is None:
        return []
    from memgov._base.errors import MemgovError
    from memgov._ledger.ledger import DeviceLedger

    ledger = DeviceLedger(ctx.device)
    try:
        with _patient(), ledger.locked():
            snap = ledger.scan(clean=True)
        return list(snap.removed)  # the dead files go once the lock is released
    except MemgovError:
        pass
    return []


class Slots:
    """Gate: at most ``parallel`` jobs of the run at once (``--parallel``, MPS clients, CUDA
    contexts: plan.py); the rest start as others end."""

    def __init__(self, run: OneRun) -> None:
        self.run = run
        self.now = 0

    def begin(self) -> None:
        self.now = len(self.run.running)

    def admits(self, job: Candidate, gpu: Gpu, placed: list[Candidate]) -> bool:
        return self.now + len(placed) < self.run.plan.parallel

    def refusal(self, job: Candidate) -> str | None:
        return None


class HostRoom:
    """Gate: a job starts only when the host's memory holds it beside the running ones and
    those this decision placed (hostmem.py); one the host cannot hold with none of the run left
    is refused (reason ``host_memory``)."""

    def __init__(self, gate: hostmem.HostGate, run: OneRun) -> None:
        self.gate, self.run = gate, run
        self.running: list[tuple[int | None, bool]] = []
        self.known: dict[int, bool] = {}

    def begin(self) -> None:
        """The run's jobs as the sampler sees them: (largest USS, past its first epoch)."""
        run = self.run
        self.running = [
            (run.sampler.jobs[label].uss, run.by_label[label].first("epoch") is not None)
            for label in run.running
        ]
        self.known = {}

    def admits(self, job: Candidate, gpu: Gpu, placed: list[Candidate]) -> bool:
        more = len(placed)  # each placed job counts with all of its growth ahead
        if more not in self.known:
            self.known[more] = self.gate.fits(self.running + [(None, False)] * more)
        return self.known[more]

    def refusal(self, job: Candidate) -> str | None:
        return None if self.gate.fits([]) else self.gate.refusal()


def _peak(record: RunRecord, what: Literal["footprint_mib", "uss_mib"]) -> int | None:
    """The largest ``what`` (a job record's MiB figure) of a run's jobs that finished, in bytes."""
    peaks = [mib for j in record["jobs"] if j["status"] == "ok" and (mib := j[what])]
    return int(max(peaks) * 2**20) if peaks else None


def _blank() -> Any:
    from memgov.pack.monitor import JobSample

    return JobSample()


def _root(ctx: Context, job: Job) -> Callable[[], int | None]:
    def find() -> int | None:
        if job.proc is None:
            return None
        return ctx.runner.host_root(job.proc.pid, job.container)

    return find


def _stop_all(
    ctx: Context, jobs: list[Job], pending: deque[Job], why: str, sig: int = signal.SIGTERM
) -> None:
    while pending:
        pending.popleft().stopped_by = why
    for job in jobs:
        job.stop(ctx.runner, why, sig)


def _reap(ctx: Context, jobs: list[Job]) -> None:
    """Wait for stopped jobs to end: SIGTERM's grace, then SIGKILL. A second Ctrl-C skips ahead."""
    with _patient():
        deadline = time.monotonic() + STOP_GRACE_S
        while any(j.running for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
    for job in jobs:
        if job.running:
            job.stop(ctx.runner, "interrupted", signal.SIGKILL)
    with _patient():
        for job in jobs:
            job.wait_ended(5.0)


@contextlib.contextmanager
def _patient() -> Iterator[None]:
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        yield
