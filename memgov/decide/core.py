"""One decision, for every front end: the ready jobs placed by a policy of the registry.

The trace simulator (memgov/placement/simulate.py) places one arriving job at a time on its
cluster: the feasible nodes, the policy's `score`, :func:`choose`. A host (the queue, pack, the
Ray driver) gives a :class:`~memgov.decide.view.View`; :func:`decide` turns its GPUs into a
cluster of one-GPU nodes (a job's share: its claim over the largest GPU's capacity, in milli) and
places its jobs in the policy's order by the same `score` and `choose`, after the host's own
checks: the job's pin, the GPU's free bytes, the front end's gates and the policy's ``admits``
(its learned hold-backs). The engine (memgov/queue/engine.py) checks every placement again.
"""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from memgov.decide.model import MILLI, Assignment, ClusterState, Demand, Node
from memgov.decide.policies import DEFAULT_DURATION_S, Policy, Scores
from memgov.decide.view import Candidate, Gpu, Placement, Running, View


def effective(policy: Policy, demand: Demand) -> Demand:
    """The demand as the policy places it: an exclusive policy gives a sharing job its GPU whole."""
    if policy.exclusive and demand.shares_gpu:
        return dataclasses.replace(demand, gpu_milli=MILLI)
    return demand


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

    ``scored`` and ``nodes`` may come from a cache (the simulator's) or from a host's own checks
    (:func:`decide`); otherwise they are computed.
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


class HostBook:
    """One host decision: its GPUs as a cluster of one-GPU nodes, and what it placed so far."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.unit = max((g.capacity for g in view.gpus), default=1) or 1
        """Bytes of one milli-GPU times 1000: the largest GPU's capacity."""
        self.state = ClusterState(
            [Node(f"gpu{g.index}", max(1, view.cores) * 1000, 0, 1) for g in view.gpus]
        )
        self.state.gpu_left[:, 0] = [self.milli(g.free, up=False) for g in view.gpus]
        self.free = {g.index: g.free for g in view.gpus}
        self.added: dict[int, list[Candidate]] = {g.index: [] for g in view.gpus}
        self.out: list[Placement] = []
        self._reservation: tuple[Candidate, int, float] | None = None
        self._reserved = False

    def milli(self, size: int, up: bool = True) -> int:
        share = size * MILLI / self.unit
        return int(min(MILLI, max(1 if up else 0, np.ceil(share) if up else np.floor(share))))

    def demand(self, job: Candidate) -> Demand:
        return Demand(str(job.id), 0, 0, 1, self.milli(job.claim))

    def busy(self, gpu: Gpu) -> bool:
        return bool(gpu.running or self.added[gpu.index])

    def kinds_on(self, gpu: Gpu) -> list[str]:
        return [r.kind for r in gpu.running] + [c.kind for c in self.added[gpu.index]]

    def members_on(self, gpu: Gpu) -> list[tuple[str, float]]:
        return [(r.kind, r.util) for r in gpu.running] + [
            (c.kind, c.util) for c in self.added[gpu.index]
        ]

    def end_of(self, run: Running, gpu: Gpu) -> float:
        """When a running job is expected to end (its solo time by the learned slowdown)."""
        view = self.view
        expected = run.expected_s or DEFAULT_DURATION_S
        others = [r.kind for r in gpu.running if r.id != run.id]
        end = run.started + expected * view.learned.slowdown(run.kind, others)
        return end if end > view.now else view.now + 0.1 * expected

    def reservation(self, policy: Policy) -> tuple[Candidate, int, float] | None:
        """(job, GPU index, when) that the policy keeps for a job that waited too long."""
        if not self._reserved:
            self._reserved = True
            starving = getattr(policy, "starving", None)
            head = starving(self.view.jobs, self.view.now) if starving else None
            self._reservation = self._reserve(head) if head is not None else None
        return self._reservation

    def _reserve(self, job: Candidate) -> tuple[Candidate, int, float] | None:
        """The GPU that frees room for ``job`` first, and when (EASY backfilling)."""
        best: tuple[Candidate, int, float] | None = None
        for gpu in self.view.gpus:
            if (job.gpu is not None and job.gpu != gpu.index) or gpu.capacity < job.claim:
                continue
            free = self.free[gpu.index]
            if free >= job.claim:
                return None  # it fits now: nothing to keep
            for end, claim in sorted((self.end_of(r, gpu), r.claim) for r in gpu.running):
                free += claim
                if free >= job.claim:
                    if best is None or end < best[2]:
                        best = (job, gpu.index, end)
                    break
        return best

    def gpus_for(self, policy: Policy, job: Candidate) -> list[Gpu]:
        """The GPUs the job may go to now: its pin, the free bytes, the gates, the policy."""
        return [
            g
            for g in self.view.gpus
            if (job.gpu is None or job.gpu == g.index)
            and self.free[g.index] >= job.claim
            and not (policy.exclusive and self.busy(g))
            and all(gate.admits(job, g, self.added[g.index]) for gate in self.view.gates)
            and policy.admits(job, g, self)
        ]

    def place(self, job: Candidate, gpu: Gpu, demand: Demand) -> None:
        node = self.view.gpus.index(gpu)
        self.free[gpu.index] -= job.claim
        self.added[gpu.index].append(job)
        left = self.state.gpu_left
        left[node, 0] = max(0, left[node, 0] - demand.gpu_milli)
        self.state.version[node] += 1
        self.out.append((job.id, gpu.index))


def place(policy: Policy, view: View, rng: np.random.Generator | None = None) -> list[Placement]:
    """Place the view's jobs in the policy's order: each on the node (GPU) it scores best among
    those the host's checks allow; what fits nowhere waits."""
    book = HostBook(view)
    rng = rng or np.random.default_rng(0)
    if policy.typical_jobs:
        _prepare(policy, book)
    for job in policy.order(view):
        gpus = book.gpus_for(policy, job)
        if not gpus:
            continue
        demand = effective(policy, book.demand(job))
        nodes = np.array([view.gpus.index(g) for g in gpus], dtype=np.int64)
        scores, chosen = policy.score(book.state, demand, nodes, rng)
        # Above the score, the host's learned preference; its steps are larger than any score.
        scores = scores + 1000.0 * policy.rank(job, gpus, book)
        where = choose(policy, book.state, demand, rng, (scores, chosen), nodes)
        if where is not None:
            book.place(job, view.gpus[where.node], demand)
    return book.out


_PREPARED: weakref.WeakKeyDictionary[Policy, tuple[int, ...]] = weakref.WeakKeyDictionary()
"""Per policy object, the workload (its jobs' shares) it was last prepared with."""


def _prepare(policy: Policy, book: HostBook) -> None:
    """A host's typical jobs are the jobs it holds now, ready and running: prepared again only
    when their shares changed (a table of a few milliseconds, memgov/decide/fragmentation.py)."""
    running = [r for g in book.view.gpus for r in g.running]
    shares = sorted(
        [book.milli(j.claim) for j in book.view.jobs] + [book.milli(r.claim) for r in running]
    )
    key = tuple(shares)
    if _PREPARED.get(policy) != key:
        policy.prepare([Demand(f"job{i}", 0, 0, 1, milli) for i, milli in enumerate(shares)])
        _PREPARED[policy] = key
