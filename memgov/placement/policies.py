"""Placement policies, looked up by name: where one job goes on a cluster.

A policy scores the nodes where a job fits (higher is better) and, for a job that shares a GPU,
names the GPU it would use on each; `choose` takes the best score, breaking ties as the FGD
simulator's scheduler does (a fixed order of nodes). The simulator (`memgov queue simulate`) and
the queue use the same objects, found by the same names (`get_policy`).

The trace's schedulers, as the FGD simulator (hkust-adsl/kubernetes-scheduler-simulator) scores
them, integer scores 0-100 included (their ties are part of how they behave):

- ``random``: any node where the job fits, any GPU with room.
- ``dotprod`` (alias ``tetris``): Tetris' alignment, the dot product of the node's free CPU and
  GPU with the job's demand (each over the largest node: 128 CPUs, 8 GPUs); smaller is better.
- ``gpupacking``: a GPU already shared first, then idle GPUs of a node in use, then an idle node.
- ``bestfit``: the node with the least CPU and GPU left after placing the job.
- ``fgd``: fragmentation gradient descent, the node and GPU where fragmentation grows least.
- ``memgov`` (alias ``default``): FGD's scoring of the GPU milli expected to stay idle after
  the next few typical jobs, not of what the next one cannot use (`MemgovPolicy`).

All but ``random`` and ``fgd`` put a GPU-sharing job on the fullest GPU with room (best fit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from memgov.placement.fragmentation import (
    LOOK_AHEAD_JOBS,
    ExpectedWaste,
    TypicalJobs,
    fragment_after,
)
from memgov.placement.model import MILLI, Assignment, ClusterState, Demand

MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8 * MILLI
"""The largest node of the trace, by which DotProd and BestFit normalise (the simulator's)."""

Scores = tuple[np.ndarray, np.ndarray]
"""Per candidate node: its score, and the GPU a sharing job would use there (-1: none chosen)."""


class Policy(Protocol):
    name: str
    cacheable: bool
    """Scores depend only on the node's state and the job's kind (no randomness, no neighbours):
    a caller may keep them per job kind and rescore only the nodes that changed."""

    def prepare(self, workload: Sequence[Demand]) -> None:
        """See the workload's demands before placing (FGD learns its typical jobs here)."""

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores: ...


def best_fit_gpu(state: ClusterState, demand: Demand, nodes: np.ndarray) -> np.ndarray:
    """On each node, the GPU with the least left that still fits (first by index on ties)."""
    if not demand.shares_gpu:
        return np.full(len(nodes), -1)
    left = state.gpu_left[nodes]
    return np.argmin(np.where(left >= demand.gpu_milli, left, MILLI + 1), axis=1)


class _Stateless:
    cacheable = True

    def prepare(self, workload: Sequence[Demand]) -> None:
        return None


class RandomPolicy(_Stateless):
    name = "random"
    cacheable = False

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        gpu = np.full(len(nodes), -1)
        if demand.shares_gpu:
            left = state.gpu_left[nodes]
            keys = np.where(left >= demand.gpu_milli, rng.random(left.shape), -1.0)
            gpu = np.argmax(keys, axis=1)
        return rng.random(len(nodes)), gpu


class DotProductPolicy(_Stateless):
    name = "dotprod"

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        cpu = state.cpu_left[nodes] / MAX_CPU_MILLI * (demand.cpu_milli / MAX_CPU_MILLI)
        gpu_left = state.gpu_left[nodes].sum(axis=1)
        gpu = gpu_left / MAX_GPU_MILLI * (demand.total_gpu_milli / MAX_GPU_MILLI)
        return np.trunc(100 * (1 - (cpu + gpu) / 2)), best_fit_gpu(state, demand, nodes)


class BestFitPolicy(_Stateless):
    name = "bestfit"

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        cpu = (state.cpu_left[nodes] - demand.cpu_milli) / MAX_CPU_MILLI
        gpu = (state.gpu_left[nodes].sum(axis=1) - demand.total_gpu_milli) / MAX_GPU_MILLI
        return np.trunc(100 * (1 - 0.5 * cpu - 0.5 * gpu)), best_fit_gpu(state, demand, nodes)


class GpuPackingPolicy(_Stateless):
    name = "gpupacking"

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        gpu = best_fit_gpu(state, demand, nodes)
        if demand.num_gpu == 0:
            return np.zeros(len(nodes)), gpu
        left = state.gpu_left[nodes]
        idle = (left == MILLI).sum(axis=1)
        all_idle = idle == state.gpu_count[nodes]
        idle_node = np.maximum(100 // 3 - idle, idle)
        if demand.shares_gpu:
            chosen = left[np.arange(len(nodes)), gpu]
            uses_idle = (chosen == MILLI).astype(np.int64)
            shared = np.maximum(100 - (chosen * 100 // MILLI) // 10, 50)
        else:
            uses_idle = np.full(len(nodes), demand.num_gpu)
            shared = np.zeros(len(nodes), dtype=np.int64)
        used_node = np.where(uses_idle > 0, np.maximum(50 - uses_idle, 100 // 3), shared)
        return np.where(all_idle, idle_node, used_node).astype(float), gpu


class FGDPolicy:
    """Fragmentation gradient descent, as the FGD simulator scores it: sigmoid of the drop in
    fragmentation (milli / 1000) scaled to an integer 0-100; ties at random."""

    name = "fgd"
    cacheable = True

    def __init__(self) -> None:
        self.typical: TypicalJobs | None = None

    def prepare(self, workload: Sequence[Demand]) -> None:
        self.typical = TypicalJobs.of(workload)

    def _typical(self) -> TypicalJobs:
        if self.typical is None:
            raise RuntimeError(f"policy {self.name!r} needs prepare(workload) before scoring")
        return self.typical

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        before, after = fragment_after(self._typical(), state, demand, nodes)
        if after.ndim == 1:
            return _sigmoid_score(before - after), np.full(len(nodes), -1)
        per_gpu = np.where(np.isnan(after), -1.0, _sigmoid_score(before[:, None] - after))
        gpu = np.argmax(per_gpu, axis=1)  # the first GPU of the best score, as FGD picks
        return per_gpu[np.arange(len(nodes)), gpu], gpu


def _sigmoid_score(drop: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.trunc(100.0 / (1.0 + np.exp(-drop / 1000.0)))


class MemgovPolicy(FGDPolicy):
    """memgov's policy: FGD's score over a look-ahead of the waste, not over one job's fragment.

    Where FGD counts how much of a node's idle GPU milli the typical job could not use right now,
    memgov counts how much it expects to stay idle for good (`ExpectedWaste`): what the next few
    typical jobs, drawn by how often they occur, would leave on each GPU, with the node's CPUs
    left deciding which of them fit at all. A job goes where that grows least, scored as FGD
    scores (an integer 0-100 of the sigmoid of the drop over 1000 milli), ties to the first node
    in the cluster's order. The typical jobs are the ones memgov has seen (``prepare``: the
    queue's history; here the trace), as FGD's are.
    """

    name = "memgov"

    def __init__(self, look_ahead: float = LOOK_AHEAD_JOBS) -> None:
        super().__init__()
        self.look_ahead = look_ahead
        self.waste: ExpectedWaste | None = None

    def prepare(self, workload: Sequence[Demand]) -> None:
        super().prepare(workload)
        self.waste = ExpectedWaste.of(self._typical(), self.look_ahead)

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        if self.waste is None:
            raise RuntimeError(f"policy {self.name!r} needs prepare(workload) before scoring")
        waste, need = self.waste, demand.gpu_milli
        left, cpu_left = state.gpu_left[nodes], state.cpu_left[nodes]
        used, idle, row, _ = waste.of_nodes(cpu_left, left)
        before = used + waste.of_idle(row, idle)
        used, idle, row, per_gpu = waste.of_nodes(cpu_left - demand.cpu_milli, left)
        if not demand.shares_gpu:  # whole GPUs leave nothing to waste, but fewer idle beside
            after = used + waste.of_idle(row, idle - demand.num_gpu)
            return _sigmoid_score(before - after), np.full(len(nodes), -1)
        # On an idle GPU the job leaves a remnant and one idle GPU fewer; on a GPU in use it
        # changes that GPU's remnant only.
        remnant = waste.table[row[:, None], np.maximum(left - need, 0)]
        on_idle = (used + waste.of_idle(row, idle - 1))[:, None] + remnant
        on_used = (used + waste.of_idle(row, idle))[:, None] - per_gpu + remnant
        after = np.where(left == MILLI, on_idle, on_used)
        scores = np.where(left >= need, _sigmoid_score(before[:, None] - after), -1.0)
        gpu = np.argmax(scores, axis=1)  # the first GPU of the best score, as FGD picks
        return scores[np.arange(len(nodes)), gpu], gpu


POLICIES: dict[str, Callable[[], Policy]] = {
    "random": RandomPolicy,
    "dotprod": DotProductPolicy,
    "gpupacking": GpuPackingPolicy,
    "bestfit": BestFitPolicy,
    "fgd": FGDPolicy,
    "memgov": MemgovPolicy,
}
ALIASES = {"tetris": "dotprod", "default": "memgov"}


def policy_names() -> list[str]:
    return [*POLICIES, *ALIASES]


def get_policy(name: str) -> Policy:
    """A fresh policy by name (case-insensitive); an unknown name says which are accepted."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in POLICIES:
        from memgov.placement.trace import TraceError

        raise TraceError(f"placement policy {name!r}: accepted {', '.join(policy_names())}")
    return POLICIES[key]()


def choose(
    policy: Policy,
    state: ClusterState,
    demand: Demand,
    rng: np.random.Generator,
    scored: Scores | None = None,
    nodes: np.ndarray | None = None,
) -> Assignment | None:
    """Where the job goes: the best-scored node where it fits, or None.

    Ties go to the node of the lowest ``state.priority``: the FGD simulator's Kubernetes fork
    breaks them by node name, after prefixing the names with a random permutation per seed.

    ``scored`` and ``nodes`` may come from a cache (the simulator's); otherwise they are computed.
    """
    if nodes is None:
        nodes = state.feasible(demand)
    if len(nodes) == 0:
        return None
    scores, gpus = scored if scored is not None else policy.score(state, demand, nodes, rng)
    best = np.flatnonzero(scores == scores.max())
    pick = int(best[np.argmin(state.priority[nodes[best]])]) if len(best) > 1 else int(best[0])
    node = int(nodes[pick])
    if demand.num_gpu == 0:
        return Assignment(node)
    if demand.shares_gpu:
        return Assignment(node, (int(gpus[pick]),))
    return Assignment(node, state.whole_gpus(node, demand.num_gpu))
