"""How an attempt ended and what follows for its job: the one rule of both runners, the local one
(memgov/queue/runner.py) and the one on Ray (memgov/queue/onray.py).

- :func:`by_exit`: an exit status (and whether the job ran out of memory) as an attempt's end;
- :func:`ran_out`: out of memory, by the job's profile run (``end: oom``) or its output's last
  lines (:data:`OOM_MARKERS`);
- :func:`settle`: the job's state after the attempt: an OOM under a learned (``auto``) size is
  queued again with OOM_GROWTH x the claim it failed under, at most MAX_RETRIES times, counted
  in ``ooms`` and ``retries``; a size the user gave is never changed;
- :func:`never`: a job no GPU can hold fails at once, saying why;
- :func:`overlap` and :func:`learn_from`: what a finished attempt teaches the slowdown model.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from typing import Any

from memgov._base.errors import MemgovError
from memgov._profiles import store as _profiles
from memgov.decide.learn import Learned
from memgov.queue.model import MAX_RETRIES, OOM_GROWTH, Attempt, Job
from memgov.queue.shepherd import LAUNCHING

OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "RESOURCE_EXHAUSTED", "MemoryError")
"""Words in a job's last 16 KiB of output that say it ran out of memory."""
NOT_STARTED_LIMIT = 3
"""A job whose shepherd ended before starting it this many times fails (local runner)."""

Span = tuple[int, str, int, float, float | None]
"""(job id, kind, gpu, start, end or None while it runs): one attempt on the co-location record."""


def profile_run(job: str, pid: Any) -> dict[str, Any] | None:
    """The run that process ``pid`` recorded in ``job``'s profile (this host's store), or None."""
    if not isinstance(pid, int):
        return None
    try:
        profile = _profiles.read(job)
    except MemgovError:
        return None
    runs = [r for r in (profile.runs if profile else []) if r.get("pid") == pid]
    return runs[-1] if runs else None


def peak_of(run: dict[str, Any] | None) -> int | None:
    """The run's peak; for a run that ran out of memory, at least what it asked for then (its
    profile's ``asked``: held + the allocation that failed), so an OOM of the job's own
    allocation past its claim is never counted as a neighbour's (report.py)."""
    peak = run.get("peak") if run else None
    asked = run.get("asked") if run and run.get("end") == "oom" else None
    values = [v for v in (peak, asked) if type(v) is int and v >= 0]
    return max(values) if values else None


def ran_out(run: dict[str, Any] | None, output_tail: str) -> bool:
    """Did the attempt run out of memory: its profile run says so, or its output does."""
    if run is not None and run.get("end") == "oom":
        return True
    return any(marker in output_tail for marker in OOM_MARKERS)


def by_exit(code: Any, oom: Callable[[], bool], detail: str = "") -> tuple[str, str]:
    """(end, detail) of a command that exited with ``code``; ``oom`` is asked only on a failure."""
    if code == 0:
        return "ok", ""
    if oom():
        return "oom", f"out of memory (exit {code})"
    if isinstance(code, int) and code < 0:
        return "killed", f"killed by {signal_name(-code)}"
    return "failed", detail or f"exit code {code}"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


NEVER_STARTED = (None, LAUNCHING, "created")
"""Phases of a live record whose shepherd had not yet begun to start the command
(memgov/queue/shepherd.py)."""


def unheld(exists: bool, data: dict[str, Any] | None) -> str:
    """How an attempt ended whose live record is not held and which left no result: its
    shepherd is gone. ``not_started`` when the command provably never started, else ``lost``."""
    phase = (data or {}).get("phase")
    return "not_started" if not exists or phase in NEVER_STARTED else "lost"


def settle(job: Job, attempt: Attempt) -> None:
    """``job``'s state after ``attempt`` (its last) ended; called on the job file under its lock
    by the local runner, in memory on Ray."""
    job.attempts[-1] = attempt
    if attempt.result in ("stopped", "not_started") and job.cancel:  # the file's flag, under
        attempt.result, attempt.detail = "cancelled", "memgov queue cancel"  # the lock: fresh
    end = attempt.result
    if end == "ok":
        job.state = "done"
    elif end == "not_started" and sum(a.result == end for a in job.attempts) >= NOT_STARTED_LIMIT:
        job.state = "failed"  # its shepherd cannot start: not tried for ever
        attempt.detail = (
            f"its shepherd ended before starting it {NOT_STARTED_LIMIT} times; "
            "see the runner's stderr"
        )
    elif end in ("stopped", "not_started"):
        job.state = "queued"
    elif end == "cancelled":
        job.state = "cancelled"
    elif end == "oom":
        job.ooms += 1
        if job.claim == "auto" and job.retries < MAX_RETRIES:  # only a size memgov learned
            job.retries += 1
            job.next_claim = grown(attempt.claim_bytes)
            job.state = "queued"
        else:
            job.state = "failed"
    else:
        job.state = "failed"


def grown(claim: int) -> int:
    """The claim after an OOM under ``claim``: OOM_GROWTH x, rounded up to a MiB."""
    return math.ceil(claim * OOM_GROWTH / 2**20) * 2**20


def never(job: Job, why: str, now: float) -> None:
    """``job`` fails without starting: no GPU it may use can hold its claim (said in ``why``)."""
    job.state = "failed"
    job.attempts.append(
        Attempt(
            len(job.attempts) + 1,
            1,
            -1,
            "",
            "",
            start=now,
            end=now,
            result="failed",
            detail=f"never started: {why}",
        )
    )


def overlap(spans: list[Span], job_id: int, gpu: int, start: float, end: float) -> dict[str, float]:
    """Per kind: job-seconds of other queue jobs beside this one on its GPU, over its run time."""
    span = max(end - start, 1e-6)
    shared: dict[str, float] = {}
    for other, kind, other_gpu, s, e in spans:
        if other == job_id or other_gpu != gpu:
            continue
        beside = min(end, e if e is not None else end) - max(start, s)
        if beside > 0:
            shared[kind] = shared.get(kind, 0.0) + beside / span
    return shared


def solo_known(learned: Learned, job: Job, given: dict[str, float]) -> float | None:
    """The job's solo time: its learned solo runs' median, else the one given (``--solo``)."""
    times = learned.solo.get(job.job)
    if times:
        return sorted(times)[len(times) // 2]
    return given.get(job.name)


def learn_from(
    learned: Learned, job: Job, attempt: Attempt, spans: list[Span], given: dict[str, float]
) -> None:
    """Record how an attempt shared its GPU (``attempt.sharing``) and, when it ended well, teach
    ``learned`` its run time (a solo time, or a slowdown beside the kinds it shared with)."""
    end = attempt.end if attempt.end is not None else attempt.start
    beside = overlap(spans, job.id, attempt.gpu, attempt.start, end)
    attempt.sharing = round(sum(beside.values()), 3)
    if attempt.result == "ok":
        solo = solo_known(learned, job, given)
        learned.finished(job.job, job.kind, end - attempt.start, beside, solo)
