"""Every policy of memgov, one interface, one registry: the same names and the same code for the
queue (`memgov queue run`/`serve`), `memgov pack`, the Ray driver and the trace simulator
(`memgov queue simulate`).

A policy orders the ready jobs (``order``) and scores the nodes where a job fits (``score``,
higher is better; on each node, the GPU a sharing job would use): memgov/decide/core.py takes the
best score, ties to the first node in the cluster's order (a host's GPUs by index; a trace's
nodes in the order the seed drew, as the FGD simulator breaks them). On a host each GPU is a node
of one GPU; a job's share of it is its claim over the largest GPU's capacity, in milli-GPUs.
A policy may also hold a job back from a busy GPU (``admits``) and rank GPUs by what it learned
(``rank``), where the front end has learned figures (the queue, pack, Ray); on a trace there are
none and both are neutral.

What each needs (``needs``), and what it does without it:

- ``fifo``: nothing. Jobs in arrival order, each on the first GPU with room.
- ``fifo-exclusive``: nothing. As fifo, one job per GPU (a job takes its GPU whole).
- ``sjf-exclusive``: solo times (learned, or a job's ``duration``). One job per GPU, shortest
  expected first; jobs with no expected time go last in arrival order (on a trace: fifo order).
- ``bestfit``: nothing. The node with the least CPU and GPU left after the job, the fullest GPU
  with room (scores in whole percent of the largest node, as the FGD simulator scores them).
- ``tetris`` (alias ``dotprod``): nothing. Tetris' alignment (Grandl et al., SIGCOMM 2014) as
  the FGD simulator scores it: the dot product of the node's free CPU and GPU with the job's
  demand, smaller is better; the fullest GPU with room.
- ``gpupacking``: nothing. A GPU already shared first, then idle GPUs of a node in use.
- ``random``: nothing. Any node and GPU with room.
- ``fgd``: the workload's typical jobs (the trace; on a host, the jobs it has been given).
  Fragmentation gradient descent (Weng et al., USENIX ATC'23).
- ``memgov`` (alias ``default``): the typical jobs; uses solo times, learned slowdowns and GPU
  utilisation where known. See :class:`Memgov`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from memgov._base.errors import ConfigError
from memgov.decide.fragmentation import (
    LOOK_AHEAD_JOBS,
    ExpectedWaste,
    TypicalJobs,
    fragment_after,
)
from memgov.decide.model import MILLI, ClusterState, Demand
from memgov.decide.view import Book, Candidate, Gpu, View

Scores = tuple[np.ndarray, np.ndarray]
"""Per candidate node: its score, and the GPU a sharing job would use there (-1: none chosen)."""

RANK_STEP = 0.05
"""memgov ranks GPUs by the work per second a job adds in steps of this (0.05: a 5 % difference
in a GPU's throughput), so closer calls fall to the waste score. Set, not tuned (the earlier
default's hold margin)."""
DEFAULT_DURATION_S = 60.0
"""An unknown job's expected time where no job of the view has one (reservations)."""
RESERVE_AFTER = 3.0
"""memgov reserves room for the oldest job once it has waited this many times its expected time
(EASY backfilling): before that, every job that fits starts (work conserving). Chosen among 1, 3
and never on the tuning mixes of benchmarks/queue/replay.py (results/cpu-2core/
2026-12-07-queue-replay.txt): 1 cost up to 8 % of makespan where a reservation idled memory."""


class Policy(Protocol):
    name: str
    needs: str
    """What it reads besides the jobs and the GPUs, and what it does without it (one line)."""
    exclusive: bool
    """One job per GPU: a job takes its GPU whole (the trace counts the whole GPU allocated)."""
    cacheable: bool
    """Scores depend only on the node's state and the job's kind (no randomness, no neighbours):
    a caller may keep them per job kind and rescore only the nodes that changed."""
    typical_jobs: bool
    """It scores by the workload's typical jobs: ``prepare`` before placing (a host prepares it
    from its jobs, memgov/decide/core.py)."""

    def prepare(self, workload: Sequence[Demand]) -> None:
        """See the workload's demands before placing (fgd and memgov take typical jobs here)."""

    def order(self, view: View) -> list[Candidate]:
        """The order it considers the view's ready jobs in."""
        ...

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores: ...

    def rank(self, job: Candidate, gpus: Sequence[Gpu], book: Book) -> np.ndarray:
        """A host's learned preference per GPU, above the score (0: none)."""
        ...

    def admits(self, job: Candidate, gpu: Gpu, book: Book) -> bool:
        """Whether ``job`` may start on ``gpu`` beside what runs and this decision placed."""
        ...


def best_fit_gpu(state: ClusterState, demand: Demand, nodes: np.ndarray) -> np.ndarray:
    """On each node, the GPU with the least left that still fits (first by index on ties)."""
    if not demand.shares_gpu:
        return np.full(len(nodes), -1)
    left = state.gpu_left[nodes]
    return np.argmin(np.where(left >= demand.gpu_milli, left, MILLI + 1), axis=1)


def first_fit_gpu(state: ClusterState, demand: Demand, nodes: np.ndarray) -> np.ndarray:
    """On each node, the first GPU by index that fits."""
    if not demand.shares_gpu:
        return np.full(len(nodes), -1)
    return np.argmax(state.gpu_left[nodes] >= demand.gpu_milli, axis=1)


class _Policy:
    """Defaults: arrival order, no workload, no learned preference, never held back."""

    needs = "nothing"
    exclusive = False
    cacheable = True
    typical_jobs = False

    def prepare(self, workload: Sequence[Demand]) -> None:
        return None

    def order(self, view: View) -> list[Candidate]:
        return sorted(view.jobs, key=lambda j: (j.arrival, j.id))

    def rank(self, job: Candidate, gpus: Sequence[Gpu], book: Book) -> np.ndarray:
        return np.zeros(len(gpus))

    def admits(self, job: Candidate, gpu: Gpu, book: Book) -> bool:
        return True


class Fifo(_Policy):
    name = "fifo"

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        return np.zeros(len(nodes)), first_fit_gpu(state, demand, nodes)


class FifoExclusive(Fifo):
    name = "fifo-exclusive"
    exclusive = True


class SjfExclusive(Fifo):
    name = "sjf-exclusive"
    needs = "solo times; without them, arrival order"
    exclusive = True

    def order(self, view: View) -> list[Candidate]:
        arrived = super().order(view)
        known = sorted((j for j in arrived if j.expected_s is not None), key=_expected)
        return known + [j for j in arrived if j.expected_s is None]


class RandomPolicy(_Policy):
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


class DotProduct(_Policy):
    name = "tetris"

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        max_cpu, max_gpu = state.largest()
        cpu = state.cpu_left[nodes] / max_cpu * (demand.cpu_milli / max_cpu)
        gpu_left = state.gpu_left[nodes].sum(axis=1)
        gpu = gpu_left / max_gpu * (demand.total_gpu_milli / max_gpu)
        return np.trunc(100 * (1 - (cpu + gpu) / 2)), best_fit_gpu(state, demand, nodes)


class BestFit(_Policy):
    name = "bestfit"

    def score(
        self, state: ClusterState, demand: Demand, nodes: np.ndarray, rng: np.random.Generator
    ) -> Scores:
        max_cpu, max_gpu = state.largest()
        cpu = (state.cpu_left[nodes] - demand.cpu_milli) / max_cpu
        gpu = (state.gpu_left[nodes].sum(axis=1) - demand.total_gpu_milli) / max_gpu
        return np.trunc(100 * (1 - 0.5 * cpu - 0.5 * gpu)), best_fit_gpu(state, demand, nodes)


class GpuPacking(_Policy):
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


class FGD(_Policy):
    """Fragmentation gradient descent, as the FGD simulator scores it: sigmoid of the drop in
    fragmentation (milli / 1000) scaled to an integer 0-100."""

    name = "fgd"
    needs = "the workload's typical jobs (a host: the jobs it was given)"
    typical_jobs = True

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


class Memgov(FGD):
    """memgov's policy, the default: pack where the waste expected to stay is least, keep every
    GPU busy, and hold back only where what was measured says sharing loses.

    **Where** (every front end): FGD's score over a look-ahead of the waste, not over one job's
    fragment. Where FGD counts how much of a node's idle GPU milli the typical job could not use
    right now, memgov counts how much it expects to stay idle for good (`ExpectedWaste`): what
    the next few typical jobs, drawn by how often they occur, would leave on each GPU, with the
    node's CPUs left deciding which of them fit at all. Scored as FGD scores (an integer 0-100 of
    the sigmoid of the drop over 1000 milli), ties to the first node in the cluster's order.

    **Above that, on a host** (what the queue, pack and Ray learn): the GPU where the job adds the
    most work per second (`rank`: an idle GPU adds 1; a busy one, by the learned slowdowns,
    memgov/decide/learn.py), in steps of 0.05 so that close calls fall to the waste score.

    **Which job first**: arrival order, and every job that fits starts (work conserving). Once
    the oldest job has waited RESERVE_AFTER times its expected time, the GPU that frees room for
    it first takes only jobs expected to end before then or that leave it room (EASY). Shortest-
    first orders (response ratio, and one that puts jobs without slack first) gave a lower mean
    JCT on the tuning mixes but up to 17 % more makespan than fifo (benchmarks/queue/replay.py
    --tune): not chosen.

    **Held back** from a busy GPU only when the learned slowdowns say the GPU would do less work
    per second with the job than without it (a pair that time-slices). ``max_slowdown`` (the
    queue's ``--max-slowdown``) adds a bound: no job on the GPU predicted slower than it, where
    a pair never measured beside each other counts as the sum of their GPU utilisations (1 each
    when not measured): unmeasured jobs run alone first, and share once measured.
    """

    name = "memgov"
    needs = (
        "typical jobs; solo times, slowdowns and GPU utilisation where learned "
        "(without them: arrival order, packing by the waste)"
    )

    def __init__(
        self, look_ahead: float = LOOK_AHEAD_JOBS, max_slowdown: float | None = None
    ) -> None:
        super().__init__()
        self.look_ahead = look_ahead
        self.max_slowdown = max_slowdown
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

    # -- on a host: which GPU by what was learned, what waits ---------------------------------

    def rank(self, job: Candidate, gpus: Sequence[Gpu], book: Book) -> np.ndarray:
        gains = [self._gain(job, gpu, book) for gpu in gpus]
        return np.floor(np.array(gains) / RANK_STEP)

    def admits(self, job: Candidate, gpu: Gpu, book: Book) -> bool:
        if not book.busy(gpu):
            return self._respects(job, gpu, book)
        if self._gain(job, gpu, book) <= 0:
            return False  # measured: the GPU would do less work with it than without it
        if self.max_slowdown is not None and not self._bounded(job, gpu, book):
            return False
        return self._respects(job, gpu, book)

    @staticmethod
    def _gain(job: Candidate, gpu: Gpu, book: Book) -> float:
        """Work per second the GPU gains by running ``job`` too (1.0 on an idle GPU)."""
        learned = book.view.learned
        kinds = book.kinds_on(gpu)

        def rate(members: list[str]) -> float:
            return sum(
                1.0 / learned.slowdown(k, members[:i] + members[i + 1 :])
                for i, k in enumerate(members)
            )

        return rate([*kinds, job.kind]) - rate(kinds)

    def _bounded(self, job: Candidate, gpu: Gpu, book: Book) -> bool:
        """No job on ``gpu``, ``job`` included, predicted slower than ``max_slowdown``; a pair
        never measured counts as the sum of the two jobs' GPU utilisations."""
        learned = book.view.learned
        members = [*book.members_on(gpu), (job.kind, job.util)]
        for i, (kind, util) in enumerate(members):
            slowdown = 1.0
            for j, (other, other_util) in enumerate(members):
                if i != j:
                    measured = learned.alpha.get(f"{kind}|{other}")
                    slowdown += (
                        measured if measured is not None else max(0.0, util + other_util - 1.0)
                    )
            assert self.max_slowdown is not None
            if slowdown > self.max_slowdown:
                return False
        return True

    def _respects(self, job: Candidate, gpu: Gpu, book: Book) -> bool:
        """EASY backfilling once the oldest job has waited long: on the GPU that frees room for
        it first, only jobs that end before then or leave it room."""
        reservation = book.reservation(self)
        if reservation is None or job is reservation[0] or gpu.index != reservation[1]:
            return True
        head, _where, when = reservation
        view = book.view
        expected = job.expected_s or _typical_time(view.jobs)
        if view.now + expected * view.learned.slowdown(job.kind, book.kinds_on(gpu)) <= when:
            return True  # ends before the reserved job can start
        freed = sum(r.claim for r in gpu.running if book.end_of(r, gpu) <= when)
        return book.free[gpu.index] - job.claim + freed >= head.claim

    def starving(self, jobs: Sequence[Candidate], now: float) -> Candidate | None:
        """The oldest job, once it has waited RESERVE_AFTER times its expected time."""
        if not jobs:
            return None
        head = min(jobs, key=lambda j: (j.arrival, j.id))
        expected = head.expected_s or _typical_time(jobs)
        return head if now - head.arrival >= RESERVE_AFTER * expected else None


def _typical_time(jobs: Sequence[Candidate]) -> float:
    known = [j.expected_s for j in jobs if j.expected_s]
    return statistics.median(known) if known else DEFAULT_DURATION_S


def _expected(job: Candidate) -> tuple[float, int]:
    return (job.expected_s or 0.0, job.id)


POLICIES: dict[str, Callable[[], Policy]] = {
    "memgov": Memgov,
    "fifo": Fifo,
    "fifo-exclusive": FifoExclusive,
    "sjf-exclusive": SjfExclusive,
    "bestfit": BestFit,
    "tetris": DotProduct,
    "gpupacking": GpuPacking,
    "fgd": FGD,
    "random": RandomPolicy,
}
ALIASES = {"dotprod": "tetris", "default": "memgov"}
DEFAULT = "memgov"


def names() -> list[str]:
    """Every accepted name, the policies first, then the aliases."""
    return [*POLICIES, *ALIASES]


def resolve(name: str | None) -> str:
    """The policy a name means (case-insensitive; None: the default); an unknown name says
    which are accepted."""
    key = (name or DEFAULT).strip().lower()
    key = ALIASES.get(key, key)
    if key not in POLICIES:
        raise ConfigError(f"policy {name!r}: accepted {', '.join(names())}")
    return key


def get(name: str | None, max_slowdown: float | None = None) -> Policy:
    """A fresh policy by name; ``max_slowdown`` is memgov's bound (refused for the others)."""
    key = resolve(name)
    if max_slowdown is None:
        return POLICIES[key]()
    if not (math.isfinite(max_slowdown) and max_slowdown >= 1.0):
        raise ConfigError(f"max slowdown {max_slowdown!r}: accepted a number of 1.0 or more")
    if key != "memgov":
        raise ConfigError(f"max slowdown: only policy 'memgov' holds one (asked of {key!r})")
    return Memgov(max_slowdown=max_slowdown)
