"""Memory realism: the trace's GPU shares as memgov budgets in MiB, and jobs that use more.

The trace's schedulers place GPU milli; a GPU-sharing job is then given ``gpu_milli / 1000`` of its
GPU's memory and trusted to keep to it. Here each placed job gets that share as a memgov budget in
MiB (the GPU model's memory, `model.GPU_MEMORY_MIB`), the CUDA context inside it, as memgov counts
budgets (whole-process footprints as NVML counts them). Then:

- ``context_mib`` (630 MiB: PyTorch's context and libraries, measured by this project at 612 MiB
  after CUDA init and 650 MiB after the first convolution) must fit in the budget, with
  ``MIN_WORK_MIB`` for the job's own tensors, or the job cannot start under a hard budget.
- A share ``overshoot_share`` of the trace's GPU jobs (by default 9 %: "approximately 9 % of deep
  learning training tasks fail due to OOM" at Microsoft and Meta, as Shi and Elkhatib sum up
  earlier studies, arXiv 2504.03887) peak above their request, by a factor drawn uniformly from
  (1, ``overshoot_max``] (1.5: an assumption; the studies give no size). Which jobs overshoot and
  by how much is a property of the job (its name): copies made by the inflation share it.

Counted per policy, in jobs (a job on several GPUs counts once): jobs that hit their own budget
(under memgov's hard budgets each such job fails alone), and of those the ones stopped although
every GPU they are on had the memory they really used (without budgets they would have run);
without budgets, the jobs on GPUs whose real use exceeds the GPU's memory (neighbours included:
any of them may be the one whose allocation fails); budgets below the context. With profiles
(``profiled=True``), memgov knows each job's peak from an earlier run (``memgov claim auto``)
and places a sharing job by its peak instead of its request.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from memgov.decide.model import MILLI, Assignment, ClusterState, Demand, Node
from memgov.decide.policies import Policy
from memgov.placement.simulate import replay

MIN_WORK_MIB = 64
"""The least a job needs beside its context (a few tensors and the allocator's first block)."""


@dataclass(frozen=True)
class MemoryModel:
    context_mib: int = 630
    overshoot_share: float = 0.09
    overshoot_max: float = 1.5


def overshoot_factors(
    workload: Sequence[Demand], seed: int, model: MemoryModel
) -> dict[str, float]:
    """Peak over request for each GPU job of the workload (1.0: keeps to its request)."""
    rng = np.random.default_rng([seed, 3])
    factors: dict[str, float] = {}
    for demand in sorted(workload, key=lambda d: d.name):
        over = demand.num_gpu > 0 and rng.random() < model.overshoot_share
        size = 1.0 - rng.random()  # in (0, 1]: the peak is above the request
        factors[demand.name] = 1.0 + (model.overshoot_max - 1.0) * size if over else 1.0
    return factors


def with_profiles(workload: Sequence[Demand], factors: dict[str, float]) -> list[Demand]:
    """The workload as memgov would claim it knowing each job's peak: a sharing job asks for its
    peak (at most a whole GPU); a job on whole GPUs cannot ask for more than whole GPUs."""
    profiled = []
    for d in workload:
        factor = factors.get(d.name, 1.0)
        if d.shares_gpu and factor > 1.0:
            d = replace(d, gpu_milli=min(MILLI, math.ceil(d.gpu_milli * factor)))
        profiled.append(d)
    return profiled


def count_ooms(
    state: ClusterState,
    jobs: Sequence[Demand],
    placed: Sequence[Assignment | None],
    factors: dict[str, float],
    model: MemoryModel,
) -> dict[str, int]:
    """Per job, not per (job, GPU): a job on several GPUs counts once however many are hit."""
    use: dict[tuple[int, int], float] = defaultdict(float)
    gpus_of: list[tuple[list[tuple[int, int]], bool]] = []  # the job's GPUs; does it overshoot
    below_context = 0
    for demand, where in zip(jobs, placed, strict=True):
        if where is None or demand.num_gpu == 0:
            continue
        budget = demand.gpu_milli / MILLI * state.gpu_memory_mib[where.node]
        factor = factors.get(demand.name, 1.0)
        below_context += budget < model.context_mib + MIN_WORK_MIB
        keys = [(where.node, gpu) for gpu in where.gpus]
        for key in keys:
            use[key] += budget * factor
        gpus_of.append((keys, factor > 1.0))
    over = {key for key, mib in use.items() if mib > state.gpu_memory_mib[key[0]]}
    return {
        "oom_with_memgov_budgets": sum(hits for _, hits in gpus_of),
        # Stopped by its hard budget although every GPU it is on had the memory it really used:
        # without budgets it would have run (the price of hard budgets without profiles).
        "stopped_with_room": sum(hits and not over.intersection(keys) for keys, hits in gpus_of),
        "jobs_on_overcommitted_gpus_without_budgets": sum(
            bool(over.intersection(keys)) for keys, _ in gpus_of
        ),
        "budgets_below_context": below_context,
    }


def memory_realism(
    workload: Sequence[Demand],
    nodes: Sequence[Node],
    policy: str | Policy,
    seed: int = 42,
    model: MemoryModel | None = None,
    profiled: bool = False,
) -> dict[str, Any]:
    """Allocation and OOMs of one policy and seed (module docstring)."""
    model = model or MemoryModel()
    factors = overshoot_factors(workload, seed, model)
    placed_workload = with_profiles(workload, factors) if profiled else list(workload)
    result, state, jobs, placed = replay(placed_workload, nodes, policy, seed)
    if profiled:  # what the jobs really use is the same; only the claims changed
        factors = {
            d.name: factors[d.name] * (d.gpu_milli / p.gpu_milli if p.gpu_milli else 1.0)
            for d, p in zip(workload, placed_workload, strict=True)
        }
    counts = count_ooms(state, jobs, placed, factors, model)
    return {
        "policy": result.policy + (" + profiles" if profiled else ""),
        "seed": seed,
        "final_percent": result.final_percent,
        "placed": result.placed,
        **counts,
    }
