"""The queue past one machine: ``memgov queue run --ray ADDRESS FILE``.

No scheduler of memgov's own across machines: each job becomes a Ray task that asks for its
GPU memory through memgov.ray (``num_gpus`` = budget / the GPU type's capacity, plus the
``gpu_memory`` and type resources the nodes declare: docs/ray.md), so Ray picks the node and
GPU with room. The policy orders the submissions (its ``order``); the exclusive policies ask
for whole GPUs. Inside the worker the command runs governed like ``memgov run``: MEMGOV_CLAIM
is its budget and MEMGOV_DEVICE the GPU Ray assigned (never re-picked), in the node's ledger
(the worker's MEMGOV_DIR). A budget of ``auto`` is sized in the driver from the job's profile
(memgov.ray's rule: Ray needs a number before it schedules).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from memgov._devices import Device
from memgov._errors import ConfigError
from memgov.queue import learn, policies
from memgov.queue.model import Attempt, Job
from memgov.queue.queuefile import JobSpec, load
from memgov.queue.report import Report, Sampler, build_report
from memgov.queue.submit import to_job

MIB = 2**20
NODE_VARIABLES = ("MEMGOV_DIR", "MEMGOV_DEVICES", "CUDA_VISIBLE_DEVICES")
"""The worker's own (the node's ledger and GPUs, Ray's GPU choice), never the driver's."""


def run_job(orders: dict[str, Any]) -> dict[str, Any]:
    """The task body: run one job's command on the GPU Ray assigned; how it ended."""
    from memgov.ray import assigned_device

    device = assigned_device()
    env = {
        **orders["env"],
        "MEMGOV_CLAIM": str(orders["budget"]),
        "MEMGOV_DEVICE": device.uuid,
        "MEMGOV_JOB": orders["job"],
    }
    for name in NODE_VARIABLES:
        if name in os.environ:
            env[name] = os.environ[name]
        else:
            env.pop(name, None)
    start = time.time()
    done = subprocess.run(
        orders["cmd"],
        cwd=orders["cwd"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    return {
        "start": start,
        "end": time.time(),
        "returncode": done.returncode,
        "device": device.uuid,
        "index": device.index,
        "node": os.uname().nodename,
        "tail": (done.stdout + done.stderr)[-4096:].decode(errors="replace"),
    }


def run_on_ray(
    file: str | os.PathLike[str] | list[JobSpec] | None,
    address: str,
    policy: str | None = None,
    solo: str | os.PathLike[str] | None = None,
) -> Report:
    """Run a queue file's jobs as Ray tasks on the cluster at ``address``; the report."""
    import ray

    import memgov.ray as mray
    from memgov.queue import _solo
    from memgov.ray._request import cluster_types

    if file is None:
        raise ConfigError("--ray runs a queue file: memgov queue run --ray ADDRESS FILE")
    specs, file_policy = (file, None) if isinstance(file, list) else _specs(file)
    chosen = policies.get(policy or file_policy)
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    types = cluster_types(ray.cluster_resources())
    if not types:
        raise ConfigError(
            f"the Ray cluster at {address} declares no memgov GPU types: start its nodes with "
            "the resources `memgov ray node-resources` prints (docs/ray.md)"
        )
    started = time.time()
    jobs = [to_job(s, dict(os.environ), "ray", started) for s in specs]
    for number, job in enumerate(jobs, 1):
        job.id = number
    began = time.perf_counter()
    order, budgets = _plan(jobs, chosen, types)
    latency = time.perf_counter() - began
    task = ray.remote(run_job)
    refs = {}
    for job in order:
        budget, capacity = budgets[job.id]
        opts = mray.options(budget, gpu=f"{capacity}MiB", num_cpus=1)
        orders = {"cmd": job.cmd, "cwd": job.cwd, "env": job.env, "budget": budget, "job": job.job}
        refs[job.id] = task.options(**opts).remote(orders)
    for job in jobs:
        _settle(job, ray.get(refs[job.id]), budgets[job.id][0])
    device = Device(0, "ray", f"ray cluster at {address}", max(types) * MIB, 0, True, None)
    sampler = Sampler([])
    return build_report(
        chosen.name, jobs, [latency], sampler, [device], _solo(solo), learn.Learned(), started
    )


def _specs(file: str | os.PathLike[str]) -> tuple[list[JobSpec], str | None]:
    parsed = load(Path(file))
    return parsed.jobs, parsed.policy


def _plan(
    jobs: list[Job], policy: policies.Policy, types: list[int]
) -> tuple[list[Job], dict[int, tuple[int, int]]]:
    """The submission order and each job's (budget bytes, GPU type capacity in MiB)."""
    from memgov.ray._request import auto_budget

    budgets: dict[int, tuple[int, int]] = {}
    for job in jobs:
        fits = sorted(types)
        if isinstance(job.claim, int):
            fits = [t for t in fits if t * MIB >= job.claim] or fits[-1:]
        capacity = fits[0]
        if job.claim == "auto":
            budget = auto_budget(job.job, capacity)[0]
        elif isinstance(job.claim, str):
            from memgov._sizes import Size

            budget = Size(job.claim, "claim").on(capacity * MIB)
        else:
            budget = job.claim
        if getattr(policy, "exclusive", False):
            budget = capacity * MIB  # one job per GPU
        budgets[job.id] = (budget, capacity)
    learned = learn.Learned()
    candidates = [
        policies.Candidate(
            j.id, j.kind, budgets[j.id][0], learned.expected(j.job, j.kind, j.duration), j.gpu
        )
        for j in jobs
    ]
    by_id = {j.id: j for j in jobs}
    return [by_id[c.id] for c in policy.order(candidates)], budgets


def _settle(job: Job, result: dict[str, Any], budget: int) -> None:
    code = result["returncode"]
    ran_out = any(m in result["tail"] for m in ("OutOfMemoryError", "CUDA out of memory"))
    end = "ok" if code == 0 else "oom" if ran_out else "killed" if code < 0 else "failed"
    job.attempts.append(
        Attempt(
            1,
            budget,
            int(result["index"]),
            result["device"],
            "",
            start=result["start"],
            end=result["end"],
            result=end,
            returncode=code,
            detail=f"node {result['node']}" + ("" if code == 0 else f"; {result['tail'][-300:]}"),
        )
    )
    job.state = "done" if code == 0 else "failed"
    job.ooms = int(end == "oom")


__all__ = ["run_job", "run_on_ray"]
