"""The cluster and the jobs placed on it: nodes of CPUs, memory and GPUs, and what a job asks for.

One model for the simulator (thousands of nodes) and for the queue (one host, a few GPUs): a
`ClusterState` holds what is left on every node as numpy arrays, so a policy scores every node of
a cluster in a few vector operations. GPU shares are in milli-GPUs, as Kubernetes GPU-sharing
schedulers (Alibaba's open-gpu-share, the FGD simulator) count them: 1000 is one whole GPU; a job
with ``gpu_milli < 1000`` shares one GPU, a job with ``num_gpu > 1`` takes whole GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

MILLI = 1000
"""One whole GPU, in milli-GPUs."""

GPU_MEMORY_MIB = {
    # The FGD simulator's table (pkg/type/open-gpu-share/utils/const.go): memory of each model the
    # Alibaba trace names, in MiB as NVML reports it. G1-G3 are undisclosed models; their sizes are
    # the simulator's round figures.
    "P4": 7611,
    "2080": 11019,
    "1080": 11178,
    "M40": 11448,
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "A10": 22731,
    "3090": 24268,
    "V100M32": 32510,
    "A100": 81251,
    "G1": 10000,
    "G2": 20000,
    "G3": 30000,
    "H100": 81559,
    "H200": 143771,
}


@dataclass(frozen=True)
class Node:
    """One machine: CPUs in milli-CPUs, memory in MiB, ``gpus`` GPUs of one ``model``."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str = ""
    gpu_memory_mib: int = 0
    """Memory of one GPU; 0 = the model's entry in GPU_MEMORY_MIB (0 when unknown)."""

    def gpu_memory(self) -> int:
        return self.gpu_memory_mib or GPU_MEMORY_MIB.get(self.model, 0)


@dataclass(frozen=True)
class Demand:
    """What one job (a pod of the trace, a job of the queue) asks for.

    ``gpu_milli`` is per GPU: 1-999 shares one GPU (``num_gpu`` is then 1), 1000 takes each of
    ``num_gpu`` GPUs whole. ``gpu_spec`` lists the GPU models the job accepts (empty: any).
    ``footprint_mib`` is what memgov measured the job to use on a GPU at its peak (its profile),
    when known; the trace's schedulers never knew it.
    """

    name: str
    cpu_milli: int
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: tuple[str, ...] = ()
    footprint_mib: int | None = None

    @property
    def shares_gpu(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def kind(self) -> tuple[int, int, int, int, tuple[str, ...]]:
        """Jobs of one kind get the same scores on the same node (what caches are keyed by)."""
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_spec)


@dataclass(frozen=True)
class Assignment:
    """Where a job went: a node and the GPUs it uses there (indices on that node)."""

    node: int
    gpus: tuple[int, ...] = ()


@dataclass
class ClusterState:
    """What is left on every node; ``place`` and ``release`` keep it and ``version`` current."""

    nodes: Sequence[Node]
    cpu_left: np.ndarray = field(init=False)
    memory_left: np.ndarray = field(init=False)
    gpu_left: np.ndarray = field(init=False)
    """[node, gpu] milli-GPUs left; padding columns of nodes with fewer GPUs stay 0."""
    version: np.ndarray = field(init=False)
    """Bumped on every change of a node: caches keyed by job kind recompute only what changed."""

    def __post_init__(self) -> None:
        width = max((n.gpus for n in self.nodes), default=0) or 1
        self.cpu_capacity = np.array([n.cpu_milli for n in self.nodes], dtype=np.int64)
        self.memory_capacity = np.array([n.memory_mib for n in self.nodes], dtype=np.int64)
        self.gpu_count = np.array([n.gpus for n in self.nodes], dtype=np.int64)
        self.gpu_exists = np.arange(width)[None, :] < self.gpu_count[:, None]
        self.models = sorted({n.model for n in self.nodes})
        self.model_index = np.array([self.models.index(n.model) for n in self.nodes])
        self.gpu_memory_mib = np.array([n.gpu_memory() for n in self.nodes], dtype=np.int64)
        self.cpu_left = self.cpu_capacity.copy()
        self.memory_left = self.memory_capacity.copy()
        self.gpu_left = np.where(self.gpu_exists, MILLI, 0).astype(np.int64)
        self.version = np.zeros(len(self.nodes), dtype=np.int64)
        self.priority = np.arange(len(self.nodes))
        """Among equal scores the node of the lowest priority wins (the simulator draws it)."""
        self.total_gpus = int(self.gpu_count.sum())
        self.used_gpu_milli = 0

    def largest(self) -> tuple[int, int]:
        """The largest node's CPU milli and GPU milli (by which tetris and bestfit normalise, as
        the FGD simulator does with the trace's: 128 CPUs, 8 GPUs)."""
        cpu = int(self.cpu_capacity.max(initial=0)) or 1
        return cpu, int(self.gpu_count.max(initial=0) * MILLI) or MILLI

    def model_allows(self, demand: Demand) -> np.ndarray:
        """Nodes whose GPU model the job accepts (every node when it names none)."""
        if not demand.gpu_spec or demand.num_gpu == 0:
            return np.ones(len(self.nodes), dtype=bool)
        wanted = [i for i, model in enumerate(self.models) if model in demand.gpu_spec]
        return np.isin(self.model_index, wanted)

    def feasible(self, demand: Demand, among: np.ndarray | None = None) -> np.ndarray:
        """Indices of the nodes (of ``among``, default all) where the job fits now."""
        idx = np.arange(len(self.nodes)) if among is None else among
        ok = (self.cpu_left[idx] >= demand.cpu_milli) & (self.memory_left[idx] >= demand.memory_mib)
        if demand.num_gpu > 0:
            ok &= self.model_allows(demand)[idx]
            left = self.gpu_left[idx]
            ok &= (left >= demand.gpu_milli).sum(axis=1) >= demand.num_gpu
        return idx[ok]

    def whole_gpus(self, node: int, count: int) -> tuple[int, ...]:
        """The first ``count`` idle GPUs of a node, by index (how the trace's schedulers pick)."""
        idle = np.flatnonzero(self.gpu_left[node] == MILLI)
        return tuple(int(i) for i in idle[:count])

    def place(self, demand: Demand, where: Assignment) -> None:
        node = where.node
        self.cpu_left[node] -= demand.cpu_milli
        self.memory_left[node] -= demand.memory_mib
        for gpu in where.gpus:
            if self.gpu_left[node, gpu] < demand.gpu_milli:
                raise ValueError(f"GPU {gpu} of node {node} has no room for {demand.name}")
            self.gpu_left[node, gpu] -= demand.gpu_milli
        self.used_gpu_milli += demand.gpu_milli * len(where.gpus)
        self.version[node] += 1

    def release(self, demand: Demand, where: Assignment) -> None:
        node = where.node
        self.cpu_left[node] += demand.cpu_milli
        self.memory_left[node] += demand.memory_mib
        for gpu in where.gpus:
            self.gpu_left[node, gpu] += demand.gpu_milli
        self.used_gpu_milli -= demand.gpu_milli * len(where.gpus)
        self.version[node] += 1

    def allocated_percent(self) -> float:
        """GPU milli allocated, in percent of all GPUs (the FGD paper's allocation rate)."""
        return 100.0 * self.used_gpu_milli / (MILLI * self.total_gpus) if self.total_gpus else 0.0
