"""Per-job and per-run figures of a pack, as plain data for report.json.

Aggregate throughput (samples/s of all jobs together) is computed two ways from the epoch
reports; an epoch runs from (arrival of its report - its ``seconds``) to the arrival:

- ``aggregate_samples_per_s``: while all jobs ran together. The window runs from the latest
  first-epoch start to the earliest last-epoch end; every epoch counts with the share of its
  samples that falls inside the window (progress taken as even within an epoch). This is the
  throughput of N packed jobs, free of start-up stagger. When jobs ran in waves (--parallel < N)
  or never all trained at once, it is the span figure below, and ``aggregate_basis`` says so.
- ``aggregate_samples_per_s_span``: every sample of every job over the whole span from the first
  epoch start to the last epoch end; start-up stagger counts against it (conservative).

``speedup`` ("x one job") is the aggregate over the one-job (solo) run's steady samples/s, and
``slowdown`` is the solo job's steady samples/s over the median job's samples/s on the same
basis: each job's samples inside the window while all ran (``per_job_samples_per_s``), or, where
there is no such window, its steady samples/s. So both figures describe the same seconds and
``speedup`` is about N / ``slowdown``; an epoch a job ran alone before or after the window (the
first starting, the last ending) counts in neither. Steady means epochs after the first (the first
holds one-time costs: cuDNN set-up, XLA compilation) when there are several.
"""

from __future__ import annotations

import statistics
from typing import Any, TypedDict

from memgov._base.sizes import mib
from memgov.pack.jobs import Job
from memgov.pack.monitor import JobSample
from memgov.pack.runners import Runner

STDERR_LINES = 6


class JobRecord(TypedDict):
    """One job in report.json (``runs[].jobs[]``; docs/pack.md)."""

    index: int
    label: str
    status: str
    reason: str | None
    detail: str | None
    exit_code: int | None
    signal: int | None
    pid: int | None
    host_pid: int | None
    container: str | None
    measured_host_pids: list[int]
    rogue_mib: int | None
    device: str | None
    epochs_done: int
    epoch_s: list[float]
    steady_epoch_s: float | None
    samples: int
    samples_per_s: float | None
    steady_samples_per_s: float | None
    epoch_spans: list[list[float]]
    prepared: Any
    test_acc: float | None
    total_s: float | None
    peak_allocator_mib: float | None
    footprint_mib: float | None
    rss_mib: float | None
    uss_mib: float | None
    claim_mib: float | None
    claim_mode: str | None
    claim_seen: str | None
    """Where pack learnt the claim: "ledger" (sampled while it was held) or "job" (reported)."""
    mps_daemon: Any
    started_s: float | None
    ready_s: float | None
    ready_parts_s: Any
    ended_s: float | None
    stdout_garbage_lines: int
    stderr_tail: list[str]
    log: str | None


class Aggregate(TypedDict):
    """Throughput of a run's jobs together (module docstring)."""

    aggregate_samples_per_s: float | None
    aggregate_samples_per_s_span: float | None
    aggregate_basis: str | None
    window_s: float | None
    span_s: float | None
    per_job_samples_per_s: float | None


class Comparison(TypedDict):
    """A run against the one-job run (:func:`compare`)."""

    slowdown: float | None
    speedup: float | None
    solo_samples_per_s: float | None


class Capacity(TypedDict):
    """How many such jobs fit at once, by each limit (:func:`capacity`)."""

    estimate: bool
    jobs_fit: dict[str, int]
    binding: str | None
    max_jobs: int | None
    cores: dict[str, Any] | None
    device_total_mib: float | None
    device_free_before_mib: float | None
    host_available_before_mib: float | None


class RunFigures(Aggregate):
    """What :func:`run_record` says of a run's jobs (its aggregate too)."""

    n: int
    ok: int
    failed: int
    reasons: dict[str, int]
    footprint_mib: float | None
    footprint_max_mib: float | None
    epoch_s: float | None
    epoch_s_max: float | None
    uss_per_job_mib: float | None
    ready_s: float | None
    ready_s_max: float | None
    rss_per_job_mib: float | None
    samples: int
    jobs: list[JobRecord]


class RunRecord(RunFigures, total=False):
    """One run in report.json (``runs[]``): the figures, then what results.complete_run and the
    engine add (how it ran, what was sampled, what would fit), then the comparison."""

    started_unix: float
    role: str
    label: str
    mode: str
    mps: bool
    threads_per_job: int | None
    parallel: int
    claim_mib: float | None
    claim_source: str | None
    trainer_args: list[str]
    rogue: dict[str, int] | None
    parallel_held_by: str | None
    wall_s: float
    timeout_s: float | None
    device_total_mib: float | None
    device_used_before_mib: float | None
    device_peak_used_mib: float | None
    host_rss_peak_mib: float | None
    host_uss_peak_mib: float | None
    host_used_peak_mib: float | None
    monitor: dict[str, Any]
    runner_details: dict[str, object]
    capacity: Capacity
    warm_up: dict[str, Any]
    removed_after_run: list[str]
    dead_records_removed: list[str]
    host_gate: dict[str, Any]
    connections: str
    decisions: dict[str, Any]
    slowdown: float | None
    speedup: float | None
    solo_samples_per_s: float | None


def job_record(job: Job, sample: JobSample, runner: Runner) -> JobRecord:
    status, reason, detail, code, sig = job.outcome(runner)
    epochs = [e for e in job.events if e.get("event") == "epoch"]
    seconds = [float(e.get("seconds") or 0.0) for e in epochs]
    samples = [int(e.get("samples") or 0) for e in epochs]
    start = job.first("start") or {}
    done = job.first("done") or {}
    # The ledger as pack sampled it; else what the job reported holding (a claim that lived
    # between two samples: a short job on a loaded host).
    given = start.get("claim")
    reported: dict[str, Any] = given if isinstance(given, dict) else {}
    claim_bytes = sample.claim_bytes or _int_or_none(reported.get("bytes"))
    claim_mode = sample.claim_mode or (str(reported["mode"]) if "mode" in reported else None)
    steady = seconds[1:] or seconds
    steady_samples = samples[1:] or samples
    spans = [
        [round(float(e["t"]) - s, 4), float(e["t"]), n]
        for e, s, n in zip(epochs, seconds, samples, strict=True)
    ]
    return {
        "index": job.spec.index,
        "label": job.spec.label,
        "status": status,
        "reason": reason,
        "detail": detail,
        "exit_code": code,
        "signal": sig,
        "pid": start.get("pid"),
        "host_pid": job.proc.pid if job.proc is not None else None,
        "container": job.container,
        "measured_host_pids": list(sample.host_pids),
        "rogue_mib": job.spec.rogue_mib or None,
        "device": start.get("device"),
        "epochs_done": len(epochs),
        "epoch_s": seconds,
        "steady_epoch_s": _round(statistics.fmean(steady)) if steady else None,
        "samples": sum(samples),
        "samples_per_s": _round(sum(samples) / sum(seconds)) if sum(seconds) > 0 else None,
        "steady_samples_per_s": (
            _round(sum(steady_samples) / sum(steady)) if steady and sum(steady) > 0 else None
        ),
        "epoch_spans": spans,
        "prepared": start.get("prepared"),
        "test_acc": done.get("test_acc"),
        "total_s": done.get("total_s"),
        "peak_allocator_mib": done.get("peak_allocator_mib"),
        "footprint_mib": mib(sample.footprint),
        "rss_mib": mib(sample.rss),
        "uss_mib": mib(sample.uss),
        "claim_mib": mib(claim_bytes),
        "claim_mode": claim_mode,
        "claim_seen": "ledger" if sample.claim_bytes else ("job" if claim_bytes else None),
        "mps_daemon": sample.mps_daemon,
        "started_s": _round(job.started),
        # Launch to the trainer's "start" report (framework imported, CUDA up, model built):
        # the start-up a packed job pays, governed admission included.
        "ready_s": (
            _round(float(start["t"]) - job.started)
            if "t" in start and job.started is not None
            else None
        ),
        "ready_parts_s": start.get("startup_s"),  # the trainer's own split of it, if it gives one
        "ended_s": _round(job.ended),
        "stdout_garbage_lines": job.garbage,
        "stderr_tail": list(job.tail)[-STDERR_LINES:] if status != "ok" else [],
        "log": str(job.log) if job.log else None,
    }


def aggregate(jobs: list[JobRecord], all_at_once: bool) -> Aggregate:
    spans = {j["label"]: j["epoch_spans"] for j in jobs if j["epoch_spans"]}
    if not spans:
        return {
            "aggregate_samples_per_s": None,
            "aggregate_samples_per_s_span": None,
            "aggregate_basis": None,
            "window_s": None,
            "span_s": None,
            "per_job_samples_per_s": None,
        }
    every = [s for js in spans.values() for s in js]
    first, last = min(s[0] for s in every), max(s[1] for s in every)
    total = sum(s[2] for s in every)
    span_rate = total / (last - first) if last > first else None
    lo = max(js[0][0] for js in spans.values())
    hi = min(js[-1][1] for js in spans.values())
    if all_at_once and hi > lo:
        inside = {label: _inside(js, lo, hi) for label, js in spans.items()}
        return {
            "aggregate_samples_per_s_span": _round(span_rate),
            "span_s": _round(last - first),
            "window_s": _round(hi - lo),
            "aggregate_samples_per_s": _round(sum(inside.values()) / (hi - lo)),
            "aggregate_basis": "all jobs running",
            "per_job_samples_per_s": _median([n / (hi - lo) for n in inside.values()]),
        }
    why = "span (jobs never all trained at once)" if all_at_once else "span (jobs ran in waves)"
    steady = [rate for j in jobs if (rate := j.get("steady_samples_per_s"))]
    return {
        "aggregate_samples_per_s_span": _round(span_rate),
        "span_s": _round(last - first),
        "window_s": None,
        "aggregate_samples_per_s": _round(span_rate),
        "aggregate_basis": why,
        "per_job_samples_per_s": _median(steady),
    }


def _inside(spans: list[list[float]], lo: float, hi: float) -> float:
    """The samples of one job's epochs that fall inside [lo, hi] (even progress in an epoch)."""
    inside = 0.0
    for start, end, n in spans:
        overlap = min(end, hi) - max(start, lo)
        if overlap > 0 and end > start:
            inside += n * overlap / (end - start)
    return inside


def run_record(jobs: list[JobRecord], *, all_at_once: bool) -> RunRecord:
    ok = [j for j in jobs if j["status"] == "ok"]
    failed = [j for j in jobs if j["status"] != "ok"]
    reasons: dict[str, int] = {}
    for j in failed:
        key = j["reason"] or "error"
        reasons[key] = reasons.get(key, 0) + 1
    basis = ok or [j for j in jobs if j["epochs_done"]]
    feet = [j["footprint_mib"] for j in basis if j["footprint_mib"] is not None]
    every_foot = [j["footprint_mib"] for j in jobs if j["footprint_mib"] is not None]
    epoch = [j["steady_epoch_s"] for j in basis if j["steady_epoch_s"] is not None]
    uss = [j["uss_mib"] for j in basis if j["uss_mib"] is not None]
    rss = [j["rss_mib"] for j in basis if j["rss_mib"] is not None]
    ready = [seconds for j in jobs if (seconds := j["ready_s"]) is not None]
    return {
        "n": len(jobs),
        "ok": len(ok),
        "failed": len(failed),
        "reasons": reasons,
        "footprint_mib": _median(feet),
        "footprint_max_mib": max(every_foot) if every_foot else None,
        "epoch_s": _median(epoch),
        "epoch_s_max": max(epoch) if epoch else None,
        "uss_per_job_mib": _median(uss),
        "ready_s": _median(ready),
        "ready_s_max": max(ready) if ready else None,
        "rss_per_job_mib": _median(rss),
        "samples": sum(j["samples"] for j in jobs),
        **aggregate(jobs, all_at_once),
        "jobs": jobs,
    }


def compare(run: RunRecord, solo: RunRecord | None) -> Comparison:
    """slowdown and speedup of a run against the one-job run, over the same seconds (the
    aggregate's basis; module docstring)."""
    if solo is None or not solo["jobs"]:
        return {"slowdown": None, "speedup": None, "solo_samples_per_s": None}
    rate = solo["jobs"][0].get("steady_samples_per_s")
    per_job = run.get("per_job_samples_per_s")
    slowdown = rate / per_job if rate and per_job else None
    speedup = (
        run["aggregate_samples_per_s"] / rate if run["aggregate_samples_per_s"] and rate else None
    )
    return {"slowdown": _round(slowdown), "speedup": _round(speedup), "solo_samples_per_s": rate}


def capacity(
    run: RunRecord,
    *,
    device_total: int | None,
    device_free_before: int | None,
    claim_bytes: int | None,
    ledger_capacity: int | None,
    host_available: int,
    mps_limit: int | None,
    contexts: int | None = None,
    cores: int | None = None,
    concurrent: int | None = None,
) -> Capacity:
    """Estimates of how many such jobs fit at once, by each limit, and which binds first.

    GPU memory (free / largest footprint; ledger capacity / claim), host memory (available /
    USS per job), MPS clients (per daemon x daemons) or CUDA contexts without MPS. Cores are no
    hard limit (jobs share them at one thread each, slower): ``cores`` says whether they did."""
    limits: dict[str, int] = {}
    foot = run["footprint_max_mib"]
    if foot and device_free_before is not None:
        limits["gpu_memory_by_footprint"] = int(device_free_before / 2**20 // foot)
    if claim_bytes and ledger_capacity is not None:
        limits["gpu_memory_by_claim"] = int(ledger_capacity // claim_bytes)
    uss = run["uss_per_job_mib"]
    if uss:
        limits["host_memory_by_uss"] = int(host_available / 2**20 // uss)
    if mps_limit is not None:
        limits["mps_clients"] = mps_limit
    if contexts is not None:
        limits["contexts"] = contexts
    binding = min(limits, key=lambda k: limits[k]) if limits else None
    return {
        "estimate": True,
        "jobs_fit": limits,
        "binding": binding,
        "max_jobs": limits.get(binding) if binding else None,
        "cores": None
        if cores is None
        else {
            "cores": cores,
            "jobs_at_once": concurrent,
            "shared": bool(concurrent and concurrent > cores),
        },
        "device_total_mib": mib(device_total),
        "device_free_before_mib": mib(device_free_before),
        "host_available_before_mib": mib(host_available),
    }


def _median(values: list[float]) -> float | None:
    return _round(statistics.median(values)) if values else None


def _int_or_none(value: object) -> int | None:
    """A byte count a job reported, if it is one (a job's report may be anything)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
