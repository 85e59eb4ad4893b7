"""What a queue run did: makespan, each job's times and slowdown, decisions, GPU memory over time.

The JSON (``memgov queue run --json`` / ``--out``) has, at the top: policy, makespan_s, jobs,
decisions {count, p50_ms, p99_ms, max_ms}, samples [{t, used_bytes, claimed_bytes, util_pct,
gpus [{gpu, used_bytes, claimed_bytes, util_pct}]}], ooms, killed_by_neighbour, retries, device
{name, total_bytes}, devices [{index, uuid, name, total_bytes; on Ray also node}]. Each job:
name, id, kind, gpu, claim_bytes, peak_bytes, arrival_s, start_s, end_s, jct_s, run_s, solo_s,
slowdown, end, ooms, retries (times in seconds from the run's start; docs/queue.md). The local
runner and the one on Ray (memgov/queue/onray.py) build it with the same code."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memgov._base.errors import ConfigError
from memgov._gpu import nvml as _nvml
from memgov._ledger.ledger import DeviceLedger

if TYPE_CHECKING:
    from memgov._gpu.devices import Device
    from memgov.decide.learn import Learned
    from memgov.decide.policies import Policy
    from memgov.queue.model import Job

SAMPLE_S = 1.0
NEIGHBOUR_SHARE = 0.95
"""An OOM below this share of its claim was no fault of the job's: the GPU ran out around it."""


class Sampler:
    """GPU memory (NVML where there is a GPU, else the ledger's and the queue's claims) and
    utilisation (NVML) once per SAMPLE_S: the totals, and each GPU's own (``gpus``).

    The local runner reads its host's GPUs (:meth:`maybe`); on Ray the driver gathers each
    node's :func:`reading` of its GPUs and adds them (:meth:`add`)."""

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self.started = time.time()
        self.samples: list[dict[str, Any]] = []
        self._last = -SAMPLE_S

    def due(self) -> bool:
        return self.next_in() <= 0

    def next_in(self) -> float:
        """Seconds until the next sample is due."""
        return max(0.0, SAMPLE_S - (time.monotonic() - self._last))

    def maybe(self, queue_bytes: dict[int, int]) -> None:
        if self.due():
            self.add([reading(d, queue_bytes.get(d.index, 0)) for d in self.devices])

    def add(self, readings: list[dict[str, Any]]) -> None:
        """One sample of ``readings`` (one per GPU, as :func:`reading` makes them)."""
        self._last = time.monotonic()
        utils = [r["util_pct"] for r in readings if r.get("util_pct") is not None]
        self.samples.append(
            {
                "t": round(time.time() - self.started, 3),
                "used_bytes": sum(r["used_bytes"] for r in readings),
                "claimed_bytes": sum(r["claimed_bytes"] for r in readings),
                "util_pct": round(statistics.mean(utils), 1) if utils else None,
                "gpus": readings,
            }
        )


def reading(device: Device, queue_bytes: int = 0) -> dict[str, Any]:
    """One GPU now: ``claimed_bytes`` (its ledger's claims, at least what the queue placed on
    it), ``used_bytes`` (NVML; the claims on a simulated GPU), ``util_pct`` (NVML, else None)."""
    try:
        ledger_claimed = DeviceLedger(device).snapshot().claimed
    except Exception:  # a ledger busy past its lock bound: this sample counts the queue's
        ledger_claimed = 0
    held = max(ledger_claimed, queue_bytes)
    util = _nvml_util(device)
    return {
        "gpu": device.index,
        "used_bytes": _nvml_used(device, held),
        "claimed_bytes": held,
        "util_pct": None if util is None else round(util, 1),
    }


def _nvml_used(device: Device, fallback: int) -> int:
    if device.simulated:
        return fallback
    try:
        return _nvml.memory(device.uuid)[1]
    except Exception:
        return fallback


def _nvml_util(device: Device) -> float | None:
    if device.simulated:
        return None
    nv = _nvml._nvml()
    if nv is None:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(device.uuid)
        return float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:
        return None


@dataclass
class Report:
    policy: str
    makespan_s: float
    jobs: list[dict[str, Any]]
    decisions: dict[str, Any]
    samples: list[dict[str, Any]]
    ooms: int
    killed_by_neighbour: int
    retries: int
    device: dict[str, Any]
    devices: list[dict[str, Any]] = field(default_factory=list)
    learned: dict[str, Any] = field(default_factory=dict)
    interrupted: int | None = None
    """The signal that stopped the runner (its unfinished jobs were queued again), or None."""
    max_slowdown: float | None = None
    """The bound the user asked for (`--max-slowdown`), or None."""

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "makespan_s": self.makespan_s,
            "jobs": self.jobs,
            "decisions": self.decisions,
            "samples": self.samples,
            "ooms": self.ooms,
            "killed_by_neighbour": self.killed_by_neighbour,
            "retries": self.retries,
            "device": self.device,
            "devices": self.devices,
            "learned": self.learned,
            "interrupted": self.interrupted,
            "max_slowdown": self.max_slowdown,
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")


def build_report(
    policy: Policy,
    jobs: list[Job],
    latencies: list[float],
    sampler: Sampler,
    devices: list[Device],
    solo: dict[str, float],
    learned: Learned,
    started: float,
    origin: float | None = None,
    nodes: dict[int, str] | None = None,
    held: tuple[list[tuple[float, int, int, int, int]], int] = ([], 0),
) -> Report:
    """``origin``: time 0 of the report; default the earliest job's submission (a file's run
    start). A runner without a file (`run` of what is queued, `serve`) counts from its start.
    ``nodes``: on Ray, the node of each GPU (``devices`` are then the cluster's).
    ``held``: the engine's jobs left waiting although a GPU had room, and how many in all."""
    t0 = origin if origin is not None else min([j.created for j in jobs] or [started])
    rows = [_job_row(j, t0, solo, learned) for j in sorted(jobs, key=lambda j: j.id)]
    ends = [r["end_s"] for r in rows if r["end_s"] is not None]
    # A simulated GPU has no memory a neighbour could take (its peaks are host memory).
    simulated = {d.uuid for d in devices if d.simulated}
    neighbour = sum(
        1
        for j in jobs
        for a in j.attempts
        if a.result == "oom"
        and a.device not in simulated
        and a.peak_bytes is not None
        and a.peak_bytes < NEIGHBOUR_SHARE * a.claim_bytes
    )
    first = devices[0]
    return Report(
        policy=policy.name,
        max_slowdown=getattr(policy, "max_slowdown", None),
        makespan_s=round(max(ends), 3) if ends else 0.0,
        jobs=rows,
        decisions=decision_stats(latencies)
        | {
            "held_with_room": held[1],
            "held_with_room_first": [
                {"t": round(t - t0, 3), "job": j, "gpu": g, "free_bytes": f, "claim_bytes": c}
                for t, j, g, f, c in held[0]
            ],
        },
        samples=_shift(sampler.samples, sampler.started - t0),
        ooms=sum(j.ooms for j in jobs),
        killed_by_neighbour=neighbour,
        retries=sum(j.retries for j in jobs),
        device={"name": first.name, "total_bytes": first.total},
        devices=[
            {"index": d.index, "uuid": d.uuid, "name": d.name, "total_bytes": d.total}
            | ({"node": nodes.get(d.index, "")} if nodes is not None else {})
            for d in devices
        ],
        learned={"alpha": dict(learned.alpha)},
    )


def _job_row(job: Job, t0: float, solo: dict[str, float], learned: Learned) -> dict[str, Any]:
    last = job.attempts[-1]
    run_s = (last.end - last.start) if last.end is not None else None
    solo_s = solo.get(job.name)
    if solo_s is None and learned.solo.get(job.job):
        solo_s = statistics.median(learned.solo[job.job])
    arrival = job.not_before - t0
    end_s = (last.end - t0) if last.end is not None else None
    return {
        "id": job.id,
        "name": job.name,
        "kind": job.kind,
        "gpu": last.gpu,
        "claim_bytes": last.claim_bytes,
        "peak_bytes": last.peak_bytes,
        "arrival_s": round(arrival, 3),
        "start_s": round(last.start - t0, 3),
        "end_s": None if end_s is None else round(end_s, 3),
        "jct_s": None if end_s is None else round(end_s - arrival, 3),
        "run_s": None if run_s is None else round(run_s, 3),
        "solo_s": solo_s,
        "slowdown": round(run_s / solo_s, 3) if run_s and solo_s else None,
        "sharing": last.sharing,
        "end": _end_word(last.result),
        "state": job.state,
        "ooms": job.ooms,
        "retries": job.retries,
        "attempts": len(job.attempts),
        "detail": last.detail,
    }


def _end_word(result: str | None) -> str:
    """The report's end: ok, failed, oom or killed (and the queue's own: cancelled, stopped,
    lost, not_started)."""
    return result or "running"


def decision_stats(latencies: list[float]) -> dict[str, Any]:
    if not latencies:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {
        "count": len(ordered),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": round(1000 * ordered[-1], 3),
    }


def _shift(samples: list[dict[str, Any]], offset: float) -> list[dict[str, Any]]:
    return [{**s, "t": round(s["t"] + offset, 3)} for s in samples]


def table(report: dict[str, Any]) -> str:
    """The report for people: one line per job, then the totals."""
    lines = [
        f"{'id':>4} {'name':<24} {'kind':<10} {'gpu':>3} {'claim':>10} {'start':>8} "
        f"{'run':>8} {'jct':>8} {'slow':>5} end"
    ]
    for row in report["jobs"]:
        claim = f"{row['claim_bytes'] / 2**20:,.0f}MiB"
        lines.append(
            f"{row['id']:>4} {row['name'][:24]:<24} {row['kind'][:10]:<10} {row['gpu']:>3} "
            f"{claim:>10} {_s(row['start_s'])} {_s(row['run_s'])} {_s(row['jct_s'])} "
            f"{_x(row['slowdown'])} {row['end']}"
            + (f" ({row['detail']})" if row["end"] not in ("ok",) and row["detail"] else "")
        )
    d = report["decisions"]
    lines.append(
        f"policy {report['policy']}: makespan {report['makespan_s']:.1f} s, "
        f"{len(report['jobs'])} jobs, {report['ooms']} OOM(s), {report['retries']} re-tr"
        f"{'y' if report['retries'] == 1 else 'ies'}, {report['killed_by_neighbour']} killed by "
        f"a neighbour; {d['count']} decisions, p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms, "
        f"max {d['max_ms']} ms"
    )
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return f"{value:8.1f}" if value is not None else f"{'-':>8}"


def _x(value: float | None) -> str:
    return f"{value:5.2f}" if value is not None else f"{'-':>5}"


def pyplot() -> Any:
    """matplotlib's pyplot (drawing to files), or ConfigError saying how to install it: asked
    before a run with --plot starts, so that a missing matplotlib costs no run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(
            f"--plot needs matplotlib, which cannot be imported here ({exc}): pip install "
            "'memgov-gpu[plots]' (the report itself needs nothing: --json or --out)"
        ) from None
    return plt


def plot(report: dict[str, Any], path: str | Path) -> None:
    """Jobs over time (one bar per job) and GPU memory over time; needs matplotlib."""
    plt = pyplot()
    fig, (bars, memory) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for row in report["jobs"]:
        if row["end_s"] is not None:
            bars.barh(row["id"], row["end_s"] - row["start_s"], left=row["start_s"])
    bars.set_ylabel("job")
    bars.set_title(f"{report['policy']}: makespan {report['makespan_s']:.1f} s")
    t = [s["t"] for s in report["samples"]]
    memory.plot(t, [s["used_bytes"] / 2**30 for s in report["samples"]], label="used")
    memory.plot(t, [s["claimed_bytes"] / 2**30 for s in report["samples"]], label="claimed")
    memory.set_xlabel("seconds")
    memory.set_ylabel("GiB")
    memory.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
