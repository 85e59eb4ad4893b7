"""Replaying a trace onto a simulated cluster, by the FGD paper's protocol (USENIX ATC'23, its
simulator hkust-adsl/kubernetes-scheduler-simulator, experiments/run_scripts):

1. The workload is the trace's jobs, ordered by name. Arrivals are the same jobs shuffled with the
   seed, then *inflated*: jobs drawn at random (with replacement, same seed) from the workload are
   appended while the GPU milli requested in all stays within 130 % of the cluster's GPUs (a draw
   that would cross it ends the inflation; a trace already above is thinned at random instead).
2. Nodes get a random order (the simulator prefixes node names with a random permutation, and its
   Kubernetes fork gives a tie to the smallest name): among equal scores the first node wins.
3. Jobs arrive one at a time and never leave; each is placed by the policy at once or fails.
4. After each arrival the allocation rate is recorded: GPU milli allocated over all GPUs. The
   curve has one point per whole percent of GPU milli arrived (0-130): the mean allocation rate of
   the arrivals that round to it. The final figure is its point at 130 %.

Policies whose scores depend only on a node's state and the job's kind are scored once per kind
and node, then only on the nodes changed since (the trace has ~150 kinds of job for 1,213 nodes).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memgov.decide.core import choose, effective
from memgov.decide.model import MILLI, Assignment, ClusterState, Demand, Node
from memgov.decide.policies import Policy, get
from memgov.placement.trace import TraceError

INFLATION = 1.3
"""Arrivals grow to 130 % of the cluster's GPU milli (the paper's ``-tune 1.3``)."""


@dataclass
class Result:
    policy: str
    seed: int
    arrived: int
    placed: int
    failed: int
    total_gpus: int
    final_percent: float
    curve: dict[int, float]
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Every field in its order (curve's keys as text, seconds rounded), then ``extra``'s."""
        fields = {k: v for k, v in vars(self).items() if k != "extra"}
        curve = {str(k): v for k, v in self.curve.items()}
        return {**fields, "curve": curve, "seconds": round(self.seconds, 3), **self.extra}


def arrivals(
    workload: Sequence[Demand], capacity_milli: int, seed: int, ratio: float = INFLATION
) -> list[Demand]:
    """The arrival sequence for one seed (step 1 of the protocol)."""
    ordered = sorted(workload, key=lambda d: d.name)
    if not any(d.total_gpu_milli for d in ordered):
        # Inflation adds jobs until the GPU milli requested reaches the target: with no GPU job
        # it would never end.
        raise TraceError(
            f"the trace's {len(ordered)} job(s) ask for no GPU (num_gpu 0 in every row); accepted "
            "a trace with at least one GPU job"
        )
    rng = np.random.default_rng([seed, 0])
    jobs = [ordered[i] for i in rng.permutation(len(ordered))]
    requested = sum(d.total_gpu_milli for d in jobs)
    target = ratio * capacity_milli
    while requested > target and jobs:
        requested -= jobs.pop(int(rng.integers(len(jobs)))).total_gpu_milli
    while requested < target:
        drawn = ordered[int(rng.integers(len(ordered)))]
        # The simulator compares the job's per-GPU milli here, then adds its total: kept as is.
        if requested + drawn.gpu_milli > target:
            break
        requested += drawn.total_gpu_milli
        jobs.append(drawn)
    return jobs


class _KindCache:
    """Feasibility, scores and GPU choices of one job kind on every node, as of node versions."""

    def __init__(self, size: int) -> None:
        self.seen = np.full(size, -1, dtype=np.int64)
        self.fits = np.zeros(size, dtype=bool)
        self.score = np.zeros(size)
        self.gpu = np.full(size, -1, dtype=np.int64)

    def refresh(
        self, policy: Policy, state: ClusterState, demand: Demand, rng: np.random.Generator
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        stale = np.flatnonzero(self.seen != state.version)
        if len(stale):
            self.seen[stale] = state.version[stale]
            self.fits[stale] = False
            fresh = state.feasible(demand, among=stale)
            if len(fresh):
                self.fits[fresh] = True
                self.score[fresh], self.gpu[fresh] = policy.score(state, demand, fresh, rng)
        nodes = np.flatnonzero(self.fits)
        return nodes, (self.score[nodes], self.gpu[nodes])


def place_all(
    policy: Policy, state: ClusterState, jobs: Sequence[Demand], rng: np.random.Generator
) -> tuple[list[Assignment | None], np.ndarray, np.ndarray]:
    """Place the jobs in order; returns each one's assignment, and after each arrival the GPU
    milli arrived so far and allocated."""
    caches: dict[tuple[Any, ...], _KindCache] = {}
    placed: list[Assignment | None] = []
    arrived_milli = np.empty(len(jobs), dtype=np.int64)
    used_milli = np.empty(len(jobs), dtype=np.int64)
    arrived = 0
    for i, asked in enumerate(jobs):
        demand = effective(policy, asked)  # an exclusive policy takes the job's GPU whole
        arrived += asked.total_gpu_milli
        if policy.cacheable:
            cache = caches.setdefault(demand.kind, _KindCache(len(state.nodes)))
            nodes, scored = cache.refresh(policy, state, demand, rng)
            where = choose(policy, state, demand, rng, scored=scored, nodes=nodes)
        else:
            where = choose(policy, state, demand, rng)
        if where is not None:
            state.place(demand, where)
        placed.append(where)
        arrived_milli[i], used_milli[i] = arrived, state.used_gpu_milli
    return placed, arrived_milli, used_milli


def allocation_curve(
    arrived_milli: np.ndarray, used_milli: np.ndarray, total_gpus: int, top: int = 130
) -> dict[int, float]:
    """Mean allocation rate per whole percent arrived (rounded half to even, as pandas does)."""
    arrived = np.round(arrived_milli / total_gpus / 10)
    allocated = np.round(used_milli / total_gpus / 10, 2)
    curve: dict[int, float] = {}
    for percent in range(top + 1):
        hit = arrived == percent
        if not hit.any():
            hit = np.abs(arrived - percent) <= 1
        if hit.any():
            curve[percent] = round(float(allocated[hit].mean()), 2)
    return curve


def replay(
    workload: Sequence[Demand],
    nodes: Sequence[Node],
    policy: str | Policy,
    seed: int = 42,
    ratio: float = INFLATION,
) -> tuple[Result, ClusterState, list[Demand], list[Assignment | None]]:
    """`simulate`, also returning the final cluster, the arrivals and where each one went."""
    chosen = get(policy) if isinstance(policy, str) else policy
    if not workload:
        raise TraceError("the trace has no jobs; accepted at least one")
    started = time.perf_counter()
    state = ClusterState(nodes)
    if state.total_gpus == 0:
        raise TraceError("the node list has no GPU; accepted at least one")
    jobs = arrivals(workload, state.total_gpus * MILLI, seed, ratio)
    state.priority = np.random.default_rng([seed, 2]).permutation(len(nodes))
    chosen.prepare(sorted(workload, key=lambda d: d.name))
    placed, arrived_milli, used_milli = place_all(
        chosen, state, jobs, np.random.default_rng([seed, 1])
    )
    curve = allocation_curve(arrived_milli, used_milli, state.total_gpus)
    failed = sum(1 for p in placed if p is None)
    result = Result(
        policy=chosen.name,
        seed=seed,
        arrived=len(jobs),
        placed=len(jobs) - failed,
        failed=failed,
        total_gpus=state.total_gpus,
        final_percent=curve[max(curve)] if curve else 0.0,
        curve=curve,
        seconds=time.perf_counter() - started,
    )
    return result, state, jobs, placed


def simulate(
    workload: Sequence[Demand],
    nodes: Sequence[Node],
    policy: str | Policy,
    seed: int = 42,
    ratio: float = INFLATION,
) -> Result:
    """Replay ``workload`` on ``nodes`` with ``policy`` by the FGD paper's protocol (above)."""
    return replay(workload, nodes, policy, seed, ratio)[0]
