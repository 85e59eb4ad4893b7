"""memgov's job queue: many jobs placed on the host's GPUs by one policy (docs/queue.md).

    import memgov.queue
    report = memgov.queue.run("jobs.toml", policy="memgov")       # a file of jobs, to the end
    report = memgov.queue.run([{"cmd": ["python", "train.py"], "claim": "2GiB"}])
    memgov.queue.add([...]); memgov.queue.cancel(3); memgov.queue.jobs()

Jobs live in each user's private store beside the ledger (memgov/queue/store.py); each attempt
runs under a shepherd (memgov/queue/shepherd.py) so a runner's death loses nothing and runs
nothing twice; policies are the decision core's (memgov/decide/).

The loop that decides, launches and follows is memgov/queue/engine.py; the runner
(memgov/queue/runner.py) is its front end for stored jobs, and ``memgov pack`` (N copies of one
job, and its solo reference) is another (memgov/pack/engine.py): one engine, two launchers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memgov._base.errors import ConfigError, QueueError
from memgov.queue.model import FINISHED, Job
from memgov.queue.queuefile import JobSpec, QueueFile, job_spec, load
from memgov.queue.report import Report, table
from memgov.queue.store import Store
from memgov.queue.submit import add as _add

__all__ = [
    "Job",
    "JobSpec",
    "QueueError",
    "Report",
    "Store",
    "add",
    "cancel",
    "jobs",
    "load",
    "run",
    "serve",
    "table",
]


def add(specs: Sequence[JobSpec | dict[str, Any]], store: Store | None = None) -> list[Job]:
    """Queue jobs for the user's runner (`memgov queue serve` or the next `memgov queue run`):
    JobSpecs or dicts of a queue file's job keys (``{"cmd": [...], "claim": "2GiB"}``)."""
    return _add(_specs(specs), store)


def jobs(store: Store | None = None) -> tuple[list[Job], list[str]]:
    """Every job of this user's queue and the problems of files that are not jobs.

    A job the store says runs, while no runner holds the queue and its shepherd is gone (no
    result, its live record unheld), is shown as the next runner will settle it: ``failed``
    (end ``lost``) or ``queued`` (end ``not_started``), never as running."""
    from memgov.queue import ends

    store = store or Store()
    found, problems = store.jobs()
    if any(j.state == "running" for j in found) and not store.runners():
        live = store.live_records()
        for job in found:
            last = job.last
            if job.state != "running" or last is None:
                continue
            held, data = live.get(last.live, (False, None))
            if held or store.read_result(job.id, last.n) is not None:
                continue  # it runs, or it ended: the next runner folds its result in
            last.result = ends.unheld(last.live in live, data)
            job.state = "failed" if last.result == "lost" else "queued"
    return found, problems


def cancel(job_id: int, store: Store | None = None) -> str:
    """Cancel a queued job, stop a running one (SIGTERM, then SIGKILL after the grace), or
    remove a job file that is not one. Returns what was done."""
    store = store or Store()
    try:
        job = store.get(job_id)
    except QueueError as exc:
        if "no job" in str(exc):
            raise
        store.remove(job_id)
        return f"removed job file {job_id}: {exc}"
    if job.state in FINISHED:
        raise QueueError(f"job {job.label} is {job.state} already; nothing to cancel")

    def mark(stored: Job) -> None:
        if stored.state == "queued":
            stored.state = "cancelled"
        else:
            stored.cancel = True

    job = store.update(job_id, mark)
    if job.state == "cancelled":
        return f"cancelled job {job.label}"
    _stop_attempt(store, job)
    return f"stopping job {job.label} (SIGTERM, then SIGKILL after the runner's grace period)"


def _stop_attempt(store: Store, job: Job) -> None:
    if job.last is None:
        return
    from memgov.queue.shepherd import shepherd_pid

    _exists, alive, data = store.live(job.last.live)
    pid = shepherd_pid(data)
    if alive and pid is not None:  # held: the pid is that attempt's shepherd still
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)


def run(
    file_or_jobs: str | os.PathLike[str] | Sequence[JobSpec | dict[str, Any]] | None = None,
    policy: str | None = None,
    *,
    solo: str | os.PathLike[str] | dict[str, float] | None = None,
    grace_s: float = 10.0,
    store: Store | None = None,
    max_slowdown: float | None = None,
) -> Report:
    """Run a queue file (or job specs, or with None every queued job) to the end; the report.
    ``max_slowdown``: memgov's bound on each job's run time beside others over its solo time.

    A file whose run was interrupted (the runner killed or stopped) is resumed, not added again:
    its unfinished jobs run, its finished ones are kept.
    """
    from memgov import decide
    from memgov._gpu import devices as _devices
    from memgov.queue.runner import Options, Runner

    _devices.candidates("auto")  # no GPU: said before anything is queued
    if policy is not None or max_slowdown is not None:
        decide.get(policy, max_slowdown)  # a bad name or bound: said before anything is queued
    store = store or Store()
    given = _solo(solo)  # a bad --solo is refused before anything is queued, as a bad file is
    batch, file_policy = _submit(file_or_jobs, store)
    chosen = policy or file_policy
    decide.get(chosen, max_slowdown)  # the file's policy with the bound
    options = Options(chosen, max_slowdown, grace_s=grace_s, batch=batch, solo=given)
    return Runner(options, store).run()


def serve(
    policy: str | None = None,
    *,
    grace_s: float = 10.0,
    store: Store | None = None,
    tell: Callable[[dict[str, Any]], None] | None = None,
    max_slowdown: float | None = None,
) -> Report:
    """Run whatever is submitted until SIGINT or SIGTERM.

    ``tell``: called with each event as it happens (a dict, its kind in ``event``): ``serving``
    (the runner holds the queue: policy, GPUs), ``start`` (an attempt started: job, GPU, claim),
    ``end`` (an attempt ended: its result and detail), ``never`` (a job no GPU can hold)."""
    from memgov import decide
    from memgov.queue.runner import Options, Runner

    decide.get(policy, max_slowdown)  # a bad name or bound: said before serving
    options = Options(policy, max_slowdown, grace_s, serve=True, what="memgov queue serve")
    if tell is None:
        return Runner(options, store or Store()).run()
    return _telling(tell)(options, store or Store()).run()


def _telling(tell: Callable[[dict[str, Any]], None]) -> type[Any]:
    """A runner that tells its events, seen through the engine's front-end calls (start,
    refuse, follow, halt: memgov/queue/engine.py) and the attempts it tracks."""
    from memgov.queue.runner import Runner

    class Telling(Runner):
        said_serving = False

        def start(self, job_id: int, gpu: int, claim: int) -> None:
            super().start(job_id, gpu, claim)
            if job_id in self.tracked:  # not cancelled meanwhile
                self._tell("start", self.jobs[job_id])

        def refuse(self, job_id: int, why: str) -> None:
            super().refuse(job_id, why)
            self._tell("never", self.jobs[job_id], detail=why)

        def follow(self) -> bool:
            if not self.said_serving:  # the runner's record is held: this one serves
                self.said_serving = True
                gpus = [
                    {"gpu": d.index, "name": d.name, "total_bytes": d.total} for d in self.devices
                ]
                tell(
                    {"event": "serving", "t": time.time(), "policy": self.policy.name, "gpus": gpus}
                )
                for tracked in self.tracked.values():  # a previous runner's, adopted
                    self._tell("adopt", tracked.job)
            return self._ends(super().follow)

        def halt(self, error: BaseException | None) -> None:
            self._ends(lambda: super(Telling, self).halt(error))

        def _ends(self, step: Callable[[], Any]) -> Any:
            before = set(self.tracked)
            done = step()
            for job_id in sorted(before - set(self.tracked)):
                self._tell("end", self.jobs[job_id])
            return done

        def _tell(self, event: str, job: Job, **extra: Any) -> None:
            said: dict[str, Any] = {
                "event": event,
                "t": time.time(),
                "id": job.id,
                "name": job.name,
            }
            last = job.last
            if last is not None and event != "never":
                said.update(attempt=last.n, gpu=last.gpu, claim_bytes=last.claim_bytes)
            if last is not None and event == "end":
                said.update(
                    result=last.result,
                    detail=last.detail,
                    returncode=last.returncode,
                    run_s=None if last.end is None else round(last.end - last.start, 3),
                    state=job.state,
                )
            tell(said | extra)

    return Telling


def _submit(
    file_or_jobs: str | os.PathLike[str] | Sequence[JobSpec | dict[str, Any]] | None, store: Store
) -> tuple[str | None, str | None]:
    """(the batch to run, the file's policy)."""
    if file_or_jobs is None:
        return None, None
    if isinstance(file_or_jobs, (str, os.PathLike)):
        parsed: QueueFile = load(file_or_jobs)
        resumed = _unfinished_batch(store, parsed.digest)
        if resumed is not None:
            return resumed, parsed.policy
        batch = f"{parsed.digest}-{int(time.time())}"
        _add(parsed.jobs, store, batch=batch)
        return batch, parsed.policy
    batch = f"jobs-{secrets.token_hex(6)}"
    _add(_specs(file_or_jobs), store, batch=batch)
    return batch, None


def _specs(given: Sequence[JobSpec | dict[str, Any]]) -> list[JobSpec]:
    """Dicts read as a queue file's jobs are (relative paths from the working folder)."""
    if isinstance(given, (str, bytes, dict)):  # one job, not a list of them
        raise ConfigError(
            f"jobs: got a {type(given).__name__}; accepted a list of job dicts or JobSpecs"
        )
    return [
        s if isinstance(s, JobSpec) else job_spec(s, f"job {i}", Path.cwd())
        for i, s in enumerate(given, 1)
    ]


def _unfinished_batch(store: Store, digest: str) -> str | None:
    found, _problems = store.jobs()
    for job in found:
        if job.batch.startswith(digest + "-") and job.state not in FINISHED:
            return job.batch
    return None


def _solo(solo: str | os.PathLike[str] | dict[str, float] | None) -> dict[str, float]:
    """Job name -> solo run time, from a report of an exclusive run (``--solo REPORT.json``)."""
    if solo is None or isinstance(solo, dict):
        return dict(solo or {})
    try:
        data = json.loads(Path(solo).read_text())
        rows = data["jobs"]
        return {
            r["name"]: float(r["run_s"])
            for r in rows
            if r.get("end") == "ok" and isinstance(r.get("run_s"), (int, float))
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"--solo {solo}: not a queue report ({exc}); accepted the --out JSON of a "
            "`memgov queue run --policy fifo-exclusive` run of the same jobs"
        ) from None
