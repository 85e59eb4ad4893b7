"""GPU fragmentation as the FGD paper measures it (Weng et al., USENIX ATC'23, "Beware of
Fragmentation"): how many of a node's idle milli-GPUs the typical job could not use.

For every typical job t (the most common demands of the workload, weighted by how often they
occur) a node's idle GPU milli count as fragment unless t fits there (enough CPU, an accepted
model, ``num_gpu`` GPUs with ``gpu_milli`` left each); when t fits, only the GPUs with less than
``gpu_milli`` left count. A CPU-only typical job counts every idle GPU milli. The node's
fragmentation is the frequency-weighted sum; FGD places a job where that sum grows least.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memgov.decide.model import MILLI, ClusterState, Demand

MAX_NODE_GPUS = 8
"""The most GPUs of a node in the trace (more are treated as 8 by `ExpectedWaste`)."""

POPULARITY = 0.95
"""Typical jobs are the most common demands until they cover 95 % of the jobs (the simulator's
``podPopularityThreshold``)."""


@dataclass(frozen=True)
class TypicalJobs:
    cpu_milli: np.ndarray
    gpu_milli: np.ndarray
    num_gpu: np.ndarray
    frequency: np.ndarray
    specs: tuple[tuple[str, ...], ...]
    cpu_only_frequency: float
    """Summed frequency of the CPU-only typical jobs: each counts all idle GPU milli."""

    @classmethod
    def of(cls, workload: Sequence[Demand], popularity: float = POPULARITY) -> TypicalJobs:
        counts = Counter(
            (d.cpu_milli, d.gpu_milli if d.num_gpu else 0, d.num_gpu, d.gpu_spec) for d in workload
        )
        # Most frequent first; among equal counts the larger demand first (the simulator's order).
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        total, covered, kept = sum(counts.values()), 0, []
        for key, count in ranked:
            if covered >= popularity * total:
                break
            kept.append((key, count))
            covered += count
        gpu = [(k, c) for k, c in kept if k[1] > 0]
        return cls(
            cpu_milli=np.array([k[0] for k, _ in gpu], dtype=np.int64),
            gpu_milli=np.array([k[1] for k, _ in gpu], dtype=np.int64),
            num_gpu=np.array([k[2] for k, _ in gpu], dtype=np.int64),
            frequency=np.array([c / covered for _, c in gpu], dtype=np.float64),
            specs=tuple(k[3] for k, _ in gpu),
            cpu_only_frequency=sum(c for k, c in kept if k[1] == 0) / max(covered, 1),
        )

    def access(self, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """[node, typical job]: may the job run on the node's GPU model at all."""
        allowed = np.array(
            [[not spec or model in spec for spec in self.specs] for model in state.models],
            dtype=bool,
        ).reshape(len(state.models), len(self.specs))
        return allowed[state.model_index[nodes]]


def node_terms(
    typical: TypicalJobs, gpu_left: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For nodes' GPUs [node, gpu]: the idle total, and per typical job the GPUs that fit it and
    the milli left on the GPUs that do not."""
    left = gpu_left[:, :, None]
    fits = left >= typical.gpu_milli[None, None, :]
    return gpu_left.sum(axis=1), fits.sum(axis=1), np.where(fits, 0, left).sum(axis=1)


def fragment(
    typical: TypicalJobs,
    total: np.ndarray,
    fitting: np.ndarray,
    small: np.ndarray,
    cpu_left: np.ndarray,
    access: np.ndarray,
) -> np.ndarray:
    """Fragment milli of node states; ``total`` has the states' shape, the others one more axis
    (the typical jobs) last."""
    satisfied = (fitting >= typical.num_gpu) & (cpu_left[..., None] >= typical.cpu_milli) & access
    per_job = np.where(satisfied, small, total[..., None])
    return per_job @ typical.frequency + typical.cpu_only_frequency * total


def fragment_now(typical: TypicalJobs, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
    total, fitting, small = node_terms(typical, state.gpu_left[nodes])
    access = typical.access(state, nodes)
    return fragment(typical, total, fitting, small, state.cpu_left[nodes], access)


def fragment_after(
    typical: TypicalJobs, state: ClusterState, demand: Demand, nodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Fragmentation of each node now, and after the job lands there.

    The second array is [node] for a job on whole GPUs or none, [node, gpu] for a GPU-sharing
    job on each GPU (NaN where the GPU has too little left).
    """
    left = state.gpu_left[nodes]
    total, fitting, small = node_terms(typical, left)
    access = typical.access(state, nodes)
    cpu_after = state.cpu_left[nodes] - demand.cpu_milli
    before = fragment(typical, total, fitting, small, state.cpu_left[nodes], access)
    if not demand.shares_gpu:
        # Whole GPUs are idle ones (1000 left fits every typical job; 0 left fits none).
        after = fragment(
            typical,
            total - MILLI * demand.num_gpu,
            fitting - demand.num_gpu,
            small,
            cpu_after,
            access,
        )
        return before, after
    need = typical.gpu_milli[None, None, :]
    old = left[:, :, None]
    new = old - demand.gpu_milli
    fitting_after = fitting[:, None, :] - (old >= need) + (new >= need)
    small_after = small[:, None, :] - np.where(old < need, old, 0) + np.where(new < need, new, 0)
    total_after = np.broadcast_to((total - demand.gpu_milli)[:, None], left.shape)
    after = fragment(
        typical,
        total_after,
        fitting_after,
        small_after,
        np.broadcast_to(cpu_after[:, None], left.shape),
        access[:, None, :],
    )
    return before, np.where(left >= demand.gpu_milli, after, np.nan)


LOOK_AHEAD_JOBS = 8
"""How many of the next typical jobs a GPU's idle milli may be used by, in `ExpectedWaste`:
chosen among 2-10 and unbounded on seeds 0-9 of both traces, which are not the seeds reported
(42-51), as the largest mean gain over FGD on both; 4-10 all beat FGD on every one of those seeds,
2-3 and unbounded do not on gpushare100 (results/cpu-2core/2026-11-24-placement-look-ahead.txt)."""


@dataclass(frozen=True)
class ExpectedWaste:
    """The GPU milli a GPU is expected to leave idle for good, by what its node has left.

    A GPU with ``g`` milli left, on a node with ``c`` CPU milli left, meets the next
    ``look_ahead`` typical jobs (drawn by frequency). A job fits it when it asks at most ``g``
    milli per GPU and at most ``c`` CPU milli in all (a job on several GPUs needs all its CPUs on
    the node, as FGD's measure asks); the chance that one of them does is ``1 - (1 - P)^n``,
    ``P`` the summed frequency of those that fit. If none does, the ``g`` milli are wasted; if one
    does, it is one of those (by frequency) and the GPU goes on with what it leaves.

    An idle GPU is also one of the node's ``i`` idle GPUs, and a job on ``k`` whole GPUs fits it
    only when ``k <= i``: a lone idle GPU beside busy ones is open to the 1-GPU and sharing jobs
    only, and is wasted when the workload's whole-GPU jobs mostly ask for several (``idle``).
    Taking ``k`` of a node's ``i`` idle GPUs thus costs what the ``i - k`` left lose, as FGD's
    measure (which asks for ``num_gpu`` fitting GPUs) also counts.

    FGD's measure is close to the one-job step of this (``n = 1``, no recursion): a GPU of 530
    left is fragment for every typical job larger than 530, although one of the next few 470s
    or 320s will fill it; here it costs what those leave. A remnant that only rare jobs fit (190
    beside an 810-milli job) stays close to all waste either way. CPU exhaustion is in the table:
    a node without the CPUs of a job leaves its GPUs to the jobs that need fewer.
    """

    cpu_levels: np.ndarray
    """The typical jobs' CPU milli, sorted: a node's row is how many of them it has left."""
    table: np.ndarray
    """[row, milli left 0-1000]: the expected waste of one GPU (at 1000: with every job fitting)."""
    idle: np.ndarray
    """[row, idle GPUs on the node]: the expected waste of one idle GPU among that many."""

    @classmethod
    def of(cls, typical: TypicalJobs, look_ahead: float = LOOK_AHEAD_JOBS) -> ExpectedWaste:
        gpus = np.maximum(typical.num_gpu, 1)
        weight = typical.frequency * gpus  # a job on k whole GPUs meets k GPUs
        weight = weight / weight.sum() if weight.sum() else weight
        levels = np.unique(typical.cpu_milli)
        rank = np.searchsorted(levels, typical.cpu_milli)
        table = np.zeros((len(levels) + 1, MILLI + 1))
        most = max(MAX_NODE_GPUS, int(gpus.max(initial=1)))
        idle = np.zeros((len(levels) + 1, most + 1))

        def step(row: int, left: int, fits: np.ndarray) -> float:
            chance = weight[fits].sum()
            if chance <= 0:
                return float(left)
            then = weight[fits] @ table[row, left - typical.gpu_milli[fits]] / chance
            met = 1.0 - (1.0 - chance) ** look_ahead
            return float((1.0 - met) * left + met * then)

        for row in range(len(levels) + 1):
            usable = rank < row
            for left in range(1, MILLI + 1):
                table[row, left] = step(row, left, usable & (typical.gpu_milli <= left))
            for count in range(1, most + 1):
                idle[row, count] = step(row, MILLI, usable & (gpus <= count))
        return cls(levels, table, idle)

    def of_nodes(
        self, cpu_left: np.ndarray, gpu_left: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per node: the summed waste of its GPUs in use (padding GPUs have 0 left: no waste),
        its idle GPUs, its row, and per GPU [node, gpu] the waste of a GPU in use."""
        row = np.searchsorted(self.cpu_levels, cpu_left, side="right")
        per_gpu = np.where(gpu_left < MILLI, self.table[row[:, None], gpu_left], 0.0)
        idle = (gpu_left == MILLI).sum(axis=1)
        return per_gpu.sum(axis=1), idle, row, per_gpu

    def of_idle(self, row: np.ndarray, idle: np.ndarray) -> np.ndarray:
        """The summed waste of ``idle`` idle GPUs on nodes of the row ``row``."""
        return idle * self.idle[row, np.minimum(idle, self.idle.shape[1] - 1)]
