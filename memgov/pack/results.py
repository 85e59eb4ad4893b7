"""What a pack's runs leave behind: report.json's content, and the measured peaks kept in history.

plan.py decides what runs, engine.py runs it, stats.py turns samples into per-job and per-run
figures; this module puts them into the one report (keys: docs/pack.md) and records the measured
peaks that ``--claim auto`` sizes later packs from; report.py writes the files.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from typing import Any

from memgov._base.errors import MemgovError
from memgov._base.sizes import mib
from memgov._gpu import mpsctl as _mpsctl
from memgov.pack import history, stats
from memgov.pack.config import cores
from memgov.pack.monitor import Sampler
from memgov.pack.plan import Context, RunPlan
from memgov.pack.stats import RunRecord


def complete_run(
    ctx: Context,
    record: RunRecord,
    plan: RunPlan,
    sampler: Sampler,
    threads: int | None,
    concurrent: int,
    wall: float,
) -> None:
    """Add to a run's ``record`` (stats.run_record) how it ran, what was sampled, what would fit."""
    record.update(
        {
            "role": plan.role,
            "label": plan.label,
            "mode": plan.mode,
            "mps": plan.mps,
            "threads_per_job": threads,
            "parallel": concurrent,
            "claim_mib": mib(plan.claim_bytes),
            "claim_source": ctx.claim_source if plan.claim_bytes else None,
            "trainer_args": [*ctx.trainer_args, *plan.extra_args],
            "rogue": {"jobs": plan.rogue[0], "mib": plan.rogue[1]} if plan.rogue else None,
            "parallel_held_by": plan.held_by,
            "wall_s": round(wall, 3),
            "timeout_s": ctx.cfg.timeout,
            "device_total_mib": mib(sampler.device_total),
            "device_used_before_mib": mib(sampler.device_used_before),
            "device_peak_used_mib": mib(sampler.device_peak),
            "host_rss_peak_mib": mib(sampler.host_rss_peak),
            "host_uss_peak_mib": mib(sampler.host_uss_peak),
            "host_used_peak_mib": mib(sampler.host_used_peak),
            "monitor": sampler.summary(),
        }
    )
    runner = ctx.runner.summary()
    if runner is not None:
        record["runner_details"] = runner
    free_before = (
        None
        if sampler.device_total is None or sampler.device_used_before is None
        else sampler.device_total - sampler.device_used_before
    )
    real = ctx.device is not None and not ctx.device.simulated
    record["capacity"] = stats.capacity(
        record,
        device_total=ctx.device.total if real and ctx.device else None,
        device_free_before=free_before,
        claim_bytes=plan.claim_bytes,
        ledger_capacity=ctx.ledger_capacity,
        host_available=ctx.host_available,
        mps_limit=ctx.mps_limit * ctx.mps_daemons if plan.mps and ctx.mps_limit else None,
        contexts=None if plan.mps else ctx.context_limit,
        cores=cores(),
        concurrent=min(plan.n, plan.parallel),
    )


class Results:
    """The pack's report, run by run; ``report`` is what report.json holds (also when partial)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.report = _head(ctx)
        self.solo: RunRecord | None = None
        """The one-job reference run that the others are compared with."""

    def add_run(self, plan: RunPlan, record: RunRecord) -> None:
        ctx, report = self.ctx, self.report
        if plan.role == "solo" or (plan.role == "main" and plan.n == 1 and self.solo is None):
            self.solo = record
        report["runs"].append(record)
        if plan.role in ("solo", "baseline"):
            report[plan.role] = record
        if ctx.mps_info is not None:
            report["mps"] = dict(ctx.mps_info)
        if plan.role == "main" and ctx.cfg.history:  # solo/baseline jobs run with more threads
            self._record_host(record)
        if plan.role == "main" and plan.mode != "greedy" and not ctx.cpu and ctx.cfg.history:
            self._record_device(plan, record)

    def _record_device(self, plan: RunPlan, record: RunRecord) -> None:
        ctx = self.ctx
        peaks = [
            int(j["footprint_mib"] * 2**20)
            for j in record["jobs"]
            if j["status"] == "ok" and not j["rogue_mib"] and j["footprint_mib"]
        ]
        try:
            kept = history.record(
                ctx.history_key,
                peaks,
                mode=plan.mode,
                n=plan.n,
                device=ctx.device.name if ctx.device else None,
            )
            self.report["history"] = {
                "key": ctx.history_key,
                "recorded": len(peaks),
                "kept": len(kept),
                "next_auto": history.auto_size(ctx.history_key),
            }
        except MemgovError as exc:
            self.report["history"] = {"key": ctx.history_key, "error": str(exc)}

    def _record_host(self, record: RunRecord) -> None:
        # A job that trained a whole epoch has reached its size, even if it was stopped later
        # (--timeout): leaving it out left the next pack with the 2 GiB default per job.
        peaks = [
            int(j["uss_mib"] * 2**20)
            for j in record["jobs"]
            if (j["status"] == "ok" or j["epochs_done"]) and not j["rogue_mib"] and j["uss_mib"]
        ]
        with contextlib.suppress(MemgovError):  # a sizing aid: never fail a finished pack
            history.record(self.ctx.host_history_key, peaks, n=len(record["jobs"]))

    def finish(self, interrupted: bool) -> None:
        ctx, report = self.ctx, self.report
        report["interrupted"] = interrupted
        if ctx.mps_info is not None and ctx.mps_info.get("started_here"):
            report["mps"]["stopped"] = not any(
                _mpsctl.reachable(_mpsctl.paths(k).pipe) for k in range(ctx.mps_daemons)
            )
        for run in report["runs"]:  # at the end: the baseline runs before the solo job
            solo = None if run is self.solo else self.solo
            run.update(stats.compare(run, solo))
        mains = [r for r in report["runs"] if r["role"] == "main"]
        top = mains[-1] if mains else (report["runs"][-1] if report["runs"] else None)
        if top is None:
            report.update(
                n=0,
                ok=0,
                failed=0,
                jobs=[],
                footprint_mib=None,
                epoch_s=None,
                aggregate_samples_per_s=None,
                device_peak_used_mib=None,
            )
            return
        # The main run's figures at the top level; "mps" there stays the pack's MPS details.
        report.update({k: v for k, v in top.items() if k not in ("role", "label", "mps")})


def _head(ctx: Context) -> dict[str, Any]:
    import memgov

    device = None
    if ctx.device is not None:
        device = {
            "uuid": ctx.device.uuid,
            "name": ctx.device.name,
            "total_mib": mib(ctx.device.total),
            "simulated": ctx.device.simulated,
        }
    claim = None
    if ctx.claim_bytes is not None:
        claim = {"mib": mib(ctx.claim_bytes), "bytes": ctx.claim_bytes, "source": ctx.claim_source}
    return {
        "version": 1,
        "memgov": memgov.__version__,
        "command": list(sys.argv),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "experiment": ctx.manifest.name,
        "manifest": str(ctx.manifest.path),
        "framework": ctx.cfg.framework,
        "mode": ctx.cfg.mode,
        "runner": ctx.runner.name,
        "runner_why": ctx.runner_why,
        "device_kind": "cpu" if ctx.cpu else "gpu",
        "device": device,
        "host": {"cores": cores(), "available_before_mib": mib(ctx.host_available)},
        "epochs": ctx.epochs,
        "batch": ctx.batch,
        "cpu_defaults": ctx.cpu_defaults,
        "notes": ctx.notes(),
        "claim": claim,
        "mps": {"used": False, "reason": ctx.mps_reason},
        "compile_cache": {
            "folder": str(ctx.compile_cache) if ctx.compile_cache else None,
            "why": ctx.compile_cache_why,
        },
        "sweep": ctx.cfg.sweep,
        "runs": [],
        "solo": None,
        "baseline": None,
        "history": None,
        "interrupted": False,
        "out": str(ctx.out),
    }
