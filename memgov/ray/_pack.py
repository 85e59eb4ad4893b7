"""``memgov ray pack``: the pack experiment spread over a Ray cluster's GPUs, one report.

Each job is a Ray task sized by memgov.ray (Ray packs jobs per GPU by memory); in the worker it
runs the experiment's trainer (its manifest command, as ``memgov pack`` does) with
``MEMGOV_CLAIM`` and ``MEMGOV_DEVICE`` set to the GPU Ray assigned, so the trainer's auto-enable
claims exactly there. The report has one row per job, per GPU and per node. The experiment folder
must exist at the same path on every node (a shared or synced checkout).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from memgov.pack.config import PackConfig


class RayJob(TypedDict):
    """One job in the report (``jobs[]``), as its Ray task returns it."""

    job: int
    node_id: str
    hostname: str
    gpu: str
    cvd: str | None
    status: str
    reason: str | None
    detail: str | None
    epochs: int
    samples_per_s: float | None
    test_acc: float | None
    wall_s: float
    claim_line: str | None


class RayReport(TypedDict, total=False):
    """``memgov ray pack``'s report.json (``files`` once it is written)."""

    spec: dict[str, Any]
    ray_options: dict[str, Any]
    wall_s: float
    jobs: list[RayJob]
    per_node: list[dict[str, Any]]
    per_gpu: list[dict[str, Any]]
    ok: int
    failed: int
    aggregate_samples_per_s: float
    files: dict[str, str]


def job_spec(cfg: PackConfig, gpu_type: str | None) -> dict[str, Any]:
    """What each Ray task is given (and the report's ``spec``): the experiment, the options
    ``memgov ray pack`` takes (memgov/pack/config.py), Ray's GPU type, the trainer's arguments."""
    from memgov.pack.config import options

    taken = {o.name: getattr(cfg, o.name) for o in options("ray")}
    head = {"experiment": str(cfg.experiment), "n": taken.pop("n"), "claim": taken.pop("claim")}
    return {**head, "gpu": gpu_type, **taken, "trainer_args": list(cfg.trainer_args)}


def run_job(spec: dict[str, Any], index: int) -> RayJob:
    """One job, in a Ray worker: the trainer on the assigned GPU, governed by its own claim."""
    import socket

    import ray

    from memgov.pack import manifest as manifests
    from memgov.pack.jobs import classify
    from memgov.ray._worker import assigned_device

    found = manifests.load(spec["experiment"])
    device = assigned_device()
    argv = found.command(
        spec["framework"],
        python=sys.executable,
        epochs=spec["epochs"] or found.epochs or 1,
        batch=spec["batch"] or found.batch or 32,
        device=spec["device"],
    ) + list(spec["trainer_args"])
    started = time.time()
    out, err, code = _trainer(argv, found.folder, _job_env(spec, device.uuid), spec["timeout"])
    events = _events(out)
    tail = err.splitlines()[-20:]
    sig = -code if code is not None and code < 0 else None
    reason, detail = classify(
        events, code if sig is None else None, sig, tail, "timeout" if code is None else None
    )
    epochs = [e for e in events if e.get("event") == "epoch"]
    final: dict[str, Any] = next((e for e in events if e.get("event") == "done"), {})
    return {
        "job": index,
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": socket.gethostname(),
        "gpu": device.uuid,
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "status": "ok" if reason is None else "failed",
        "reason": reason,
        "detail": detail,
        "epochs": len(epochs),
        "samples_per_s": epochs[-1].get("samples_per_s") if epochs else None,
        "test_acc": final.get("test_acc"),
        "wall_s": round(time.time() - started, 2),
        "claim_line": next((x for x in tail if x.startswith("memgov: claim")), None),
    }


def _job_env(spec: dict[str, Any], device: str) -> dict[str, str]:
    """The job's environment, by memgov pack's rules (jobenv.py): the trainer claims for itself
    on ``device``, under the node's own ledger and MPS."""
    from memgov.pack import jobenv

    env = jobenv.inherited("claim", keep_mps=True)
    job = jobenv.JobEnv(
        mode="claim",
        claim=spec["claim"],
        threads=spec["threads"],
        wait=spec["wait"],
        device=device,
        mps=jobenv.MPS_OF_THE_NODE,
    )
    return {**env, **jobenv.decided(job)}


def _trainer(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float | None
) -> tuple[str, str, int | None]:
    """Run the trainer to its end: (stdout, stderr, exit code; None when --timeout stopped it)."""
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        return (exc.stdout if isinstance(exc.stdout, str) else ""), "stopped by --timeout", None
    return done.stdout, done.stderr, done.returncode


def _events(out: str) -> list[dict[str, Any]]:
    """The trainer's JSON reports, one a line of its stdout."""
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    return events


def run(
    cfg: PackConfig,
    gpu_type: str | None = None,
    address: str | None = None,
    out: Path | None = None,
) -> RayReport:
    """Submit ``cfg``'s jobs (the options ``memgov ray pack`` takes), Ray packing them by memory
    on GPUs of ``gpu_type``; wait for all, and return (and write) the report."""
    import ray

    from memgov.pack import manifest as manifests
    from memgov.ray import options

    found = manifests.load(cfg.experiment)  # a bad folder fails here, before any job starts
    found.framework(cfg.framework)
    if not ray.is_initialized():
        ray.init(address=address or "auto", log_to_driver=False)
    spec = {**job_spec(cfg, gpu_type), "experiment": str(found.path)}
    opts = options(cfg.claim, gpu=gpu_type, num_cpus=cfg.threads or 1, max_retries=0, max_calls=0)
    remote = ray.remote(**opts)(run_job)
    started = time.time()
    jobs = ray.get([remote.remote(spec, i) for i in range(cfg.n)])
    report = summarise(jobs, job_spec(cfg, gpu_type), opts, time.time() - started)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        report["files"] = {"json": str(out / "report.json")}
    return report


def summarise(
    jobs: list[RayJob], spec: dict[str, Any], opts: dict[str, Any], wall_s: float
) -> RayReport:
    def group(key: str) -> list[dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for job in jobs:
            name = job["node_id"] if key != "gpu" else f"{job['node_id'][:12]}/{job['gpu']}"
            row = rows.setdefault(
                name,
                {
                    key: name,
                    "node": job["hostname"],
                    "jobs": 0,
                    "ok": 0,
                    "failed": 0,
                    "samples_per_s": 0.0,
                },
            )
            row["jobs"] += 1
            row["ok" if job["status"] == "ok" else "failed"] += 1
            row["samples_per_s"] = round(row["samples_per_s"] + (job["samples_per_s"] or 0), 1)
        return sorted(rows.values(), key=lambda r: str(r[key]))

    return {
        "spec": spec,
        "ray_options": opts,
        "wall_s": round(wall_s, 1),
        "jobs": sorted(jobs, key=lambda j: j["job"]),
        "per_node": group("node_id"),
        "per_gpu": group("gpu"),
        "ok": sum(1 for j in jobs if j["status"] == "ok"),
        "failed": sum(1 for j in jobs if j["status"] != "ok"),
        "aggregate_samples_per_s": round(sum(j["samples_per_s"] or 0 for j in jobs), 1),
    }
