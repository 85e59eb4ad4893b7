"""The queue's policies: which ready jobs start now, and on which GPU. One interface.

A policy sees a :class:`View` (the ready jobs in submission order, each GPU's free budget and
running jobs, the learned figures, the front end's gates) and returns placements ``(job id, gpu
index)``. The engine (memgov/queue/engine.py) checks every placement against the GPU's free
budget and the gates again: no policy can start a job that does not fit (docs/queue.md).

- ``fifo-exclusive``: one job per GPU at a time, in submission order (the paper's baseline).
- ``sjf-exclusive``: one job per GPU at a time, shortest expected solo time first (the job's
  past runs, else its ``duration`` hint; jobs with neither go last, in submission order).
- ``fifo``: every job that fits, in submission order, on the first GPU (by index) with room.
- ``bestfit``: every job that fits, in submission order, on the fullest GPU with room: the one
  its claim leaves the least free budget on (ties: the lowest index).
- ``tetris``: repeatedly the (job, GPU) pair whose demand vector (memory, CPU, GPU utilisation)
  aligns best with the GPU's free vector (dot product; Grandl et al., SIGCOMM 2014).
- ``memgov``: the oldest job first (among jobs that arrived together, the longest), then the
  others longest expected first, each on the GPU where it adds the most work done per second
  (the learned slowdowns, memgov/queue/learn.py); a co-location that would make the GPU do less
  work per second than leaving the job to wait is held back, and so is one that would make any
  job on the GPU run more than MAX_SLOWDOWN (1.4x) its solo time, as predicted. When the oldest
  job cannot start, it gets a reservation (EASY backfilling): on the GPU that frees room for it
  first, other jobs start only if they are expected to end before then or leave it room.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from memgov._errors import ConfigError
from memgov.queue.learn import Learned

DEFAULT_DURATION_S = 60.0
"""An unknown job's expected time where a policy must assume one (memgov's reservation)."""
HOLD_MARGIN = 0.05
"""memgov co-locates only when the GPU's predicted work per second grows by more than this."""
MAX_SLOWDOWN = 1.4
"""memgov starts no job beside others where the predicted slowdown of any job on that GPU (the
new one or a running one) would pass this: a lab's jobs must not take much longer than alone.
1.4 leaves room for the model's error under a 1.5x bound on what is measured."""


@dataclass
class Candidate:
    id: int
    kind: str
    claim: int
    expected_s: float | None
    gpu: int | None
    """A pin to this GPU index, or None."""
    util: float = 1.0
    """GPU utilisation it needs alone (0-1); 1 unless measured."""
    arrival: float = 0.0
    """When it became ready (wall time): the oldest goes first where it fits (memgov)."""


@dataclass
class Running:
    id: int
    kind: str
    claim: int
    started: float
    expected_s: float | None
    util: float = 1.0


@dataclass
class Gpu:
    index: int
    capacity: int
    free: int
    """Bytes the queue may still place here now (the ledger's free budget, others counted)."""
    running: list[Running] = field(default_factory=list)


class Gate(Protocol):
    """A placement constraint besides the GPU's free budget (memgov/queue/engine.py): every policy
    places a job only where each gate of the view admits it, and the engine checks again.
    pack's gates: jobs at once (``--parallel``) and the host's memory (memgov/pack/hostmem.py)."""

    def begin(self) -> None:
        """Before each decision: take what runs and the measurements this decision's checks
        use (the jobs it starts are counted through ``placed``, not read again)."""
        ...

    def admits(self, job: Candidate, gpu: Gpu, placed: list[Candidate]) -> bool:
        """Whether ``job`` may start on ``gpu`` now, beside what ran at :meth:`begin` and
        ``placed`` (the jobs this decision placed there already)."""
        ...

    def refusal(self, job: Candidate) -> str | None:
        """Asked when nothing runs: why ``job`` can never start here, or None."""
        ...


@dataclass
class View:
    now: float
    jobs: list[Candidate]
    gpus: list[Gpu]
    cores: int
    learned: Learned
    gates: list[Gate] = field(default_factory=list)


Placement = tuple[int, int]


class Policy(Protocol):
    name: str

    def decide(self, view: View) -> list[Placement]: ...

    def order(self, jobs: list[Candidate]) -> list[Candidate]:
        """The order it considers jobs in (its decide places them in this order)."""
        ...


class _Book:
    """What one decision has placed so far, on top of the view."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.free = {g.index: g.free for g in view.gpus}
        self.added: dict[int, list[Candidate]] = {g.index: [] for g in view.gpus}
        self.out: list[Placement] = []

    def gpus_for(self, job: Candidate) -> list[Gpu]:
        return [
            g
            for g in self.view.gpus
            if (job.gpu is None or job.gpu == g.index)
            and self.free[g.index] >= job.claim
            and all(gate.admits(job, g, self.added[g.index]) for gate in self.view.gates)
        ]

    def busy(self, gpu: Gpu) -> bool:
        return bool(gpu.running or self.added[gpu.index])

    def kinds_on(self, gpu: Gpu) -> list[str]:
        return [r.kind for r in gpu.running] + [c.kind for c in self.added[gpu.index]]

    def place(self, job: Candidate, gpu: Gpu) -> None:
        self.free[gpu.index] -= job.claim
        self.added[gpu.index].append(job)
        self.out.append((job.id, gpu.index))


class Fifo:
    name = "fifo"
    exclusive = False

    def order(self, jobs: list[Candidate]) -> list[Candidate]:
        return list(jobs)

    def decide(self, view: View) -> list[Placement]:
        book = _Book(view)
        for job in self.order(view.jobs):
            gpus = [g for g in book.gpus_for(job) if not (self.exclusive and book.busy(g))]
            if gpus:
                book.place(job, self.pick(job, gpus, book))
        return book.out

    def pick(self, job: Candidate, gpus: list[Gpu], book: _Book) -> Gpu:
        return gpus[0]


class FifoExclusive(Fifo):
    name = "fifo-exclusive"
    exclusive = True


class SjfExclusive(Fifo):
    name = "sjf-exclusive"
    exclusive = True

    def order(self, jobs: list[Candidate]) -> list[Candidate]:
        known = sorted((j for j in jobs if j.expected_s is not None), key=_expected)
        return known + [j for j in jobs if j.expected_s is None]


class BestFit(Fifo):
    """The fullest GPU where the job fits, by the free budget it leaves."""

    name = "bestfit"

    def pick(self, job: Candidate, gpus: list[Gpu], book: _Book) -> Gpu:
        # By the bytes the job leaves free, not the placement library's score of a node: that
        # counts 1/100 of the largest node's GPU milli, so GPUs up to ~13 GiB apart on 80 GiB
        # cards tied there and the lowest index won, the emptier GPU as often as not.
        return min(gpus, key=lambda g: (book.free[g.index] - job.claim, g.index))


class Tetris:
    name = "tetris"

    def order(self, jobs: list[Candidate]) -> list[Candidate]:
        return list(jobs)

    def decide(self, view: View) -> list[Placement]:
        book = _Book(view)
        left = list(view.jobs)
        while left:
            pairs = [(self.score(j, g, book), -j.id, j, g) for j in left for g in book.gpus_for(j)]
            if not pairs:
                break
            _, _, job, gpu = max(pairs, key=lambda p: (p[0], p[1], -p[3].index))
            book.place(job, gpu)
            left.remove(job)
        return book.out

    @staticmethod
    def score(job: Candidate, gpu: Gpu, book: _Book) -> float:
        view = book.view
        cores = max(1, view.cores)
        jobs_now = sum(len(g.running) + len(book.added[g.index]) for g in view.gpus)
        util_used = sum(r.util for r in gpu.running)
        util_used += sum(c.util for c in book.added[gpu.index])
        memory = (job.claim / gpu.capacity) * (book.free[gpu.index] / gpu.capacity)
        cpu = (1 / cores) * max(0.0, (cores - jobs_now) / cores)
        util = job.util * max(0.0, 1.0 - util_used)
        return memory + cpu + util


class Memgov:
    name = "memgov"

    def __init__(self, max_slowdown: float = MAX_SLOWDOWN) -> None:
        self.max_slowdown = max_slowdown

    def order(self, jobs: list[Candidate]) -> list[Candidate]:
        """Longest expected first (unknown: the default), larger claims first among equals:
        long jobs started early do not end alone at the end of the run."""
        return sorted(jobs, key=self._rank)

    @staticmethod
    def _rank(job: Candidate) -> tuple[float, int, int]:
        return (-(job.expected_s or DEFAULT_DURATION_S), -job.claim, job.id)

    def decide(self, view: View) -> list[Placement]:
        book = _Book(view)
        if not view.jobs:
            return []
        # The head (the oldest job; among those that arrived together, the longest) starts
        # first where it may; otherwise it gets a reservation (gpu, time, bytes it needs then)
        # that the others must respect: none waits for ever.
        head = min(view.jobs, key=lambda j: (j.arrival, *self._rank(j)))
        reservation = None
        where = self._best(head, book, None)
        if where is not None:
            book.place(head, where)
        else:
            reservation = self._reserve(head, book)
        for job in self.order(view.jobs):
            if job is head:
                continue
            best = self._best(job, book, reservation)
            if best is not None:
                book.place(job, best)
        return book.out

    def _best(
        self, job: Candidate, book: _Book, reservation: tuple[int, float, int] | None
    ) -> Gpu | None:
        scored: list[tuple[float, int, Gpu]] = []
        for gpu in book.gpus_for(job):
            if reservation is not None and not self._respects(job, gpu, book, reservation):
                continue
            gain = self._gain(job, gpu, book)
            if book.busy(gpu) and (gain <= HOLD_MARGIN or not self._bounded(job, gpu, book)):
                continue  # sharing would do less work per second, or slow a job too much: wait
            scored.append((gain, -book.free[gpu.index], gpu))
        if not scored:
            return None
        return max(scored, key=lambda s: (s[0], s[1], -s[2].index))[2]

    @staticmethod
    def _gain(job: Candidate, gpu: Gpu, book: _Book) -> float:
        """Work per second the GPU gains by running ``job`` too (1.0 on an idle GPU)."""
        learned = book.view.learned
        kinds = book.kinds_on(gpu)

        def rate(members: list[str]) -> float:
            return sum(
                1.0 / learned.slowdown(k, members[:i] + members[i + 1 :])
                for i, k in enumerate(members)
            )

        return rate([*kinds, job.kind]) - rate(kinds)

    def _bounded(self, job: Candidate, gpu: Gpu, book: _Book) -> bool:
        """No job on ``gpu``, ``job`` included, predicted slower than ``max_slowdown``."""
        learned = book.view.learned
        members = [*book.kinds_on(gpu), job.kind]
        return all(
            learned.slowdown(k, members[:i] + members[i + 1 :]) <= self.max_slowdown
            for i, k in enumerate(members)
        )

    def _reserve(self, job: Candidate, book: _Book) -> tuple[int, float, int] | None:
        """The GPU that frees room for ``job`` first, and when (EASY backfilling)."""
        view = book.view
        best: tuple[int, float, int] | None = None
        for gpu in view.gpus:
            if (job.gpu is not None and job.gpu != gpu.index) or gpu.capacity < job.claim:
                continue
            free = book.free[gpu.index]
            for end, claim in sorted((self._end(r, gpu, view), r.claim) for r in gpu.running):
                free += claim
                if free >= job.claim:
                    if best is None or end < best[1]:
                        best = (gpu.index, end, job.claim)
                    break
        return best

    @staticmethod
    def _end(run: Running, gpu: Gpu, view: View) -> float:
        expected = run.expected_s or DEFAULT_DURATION_S
        others = [r.kind for r in gpu.running if r.id != run.id]
        end = run.started + expected * view.learned.slowdown(run.kind, others)
        return end if end > view.now else view.now + 0.1 * expected

    @staticmethod
    def _respects(
        job: Candidate, gpu: Gpu, book: _Book, reservation: tuple[int, float, int]
    ) -> bool:
        where, when, need = reservation
        if gpu.index != where:
            return True
        view = book.view
        expected = job.expected_s or DEFAULT_DURATION_S
        if view.now + expected * view.learned.slowdown(job.kind, book.kinds_on(gpu)) <= when:
            return True  # ends before the reserved job can start
        freed_by_then = sum(r.claim for r in gpu.running if Memgov._end(r, gpu, view) <= when)
        return book.free[gpu.index] - job.claim + freed_by_then >= need


def _expected(job: Candidate) -> tuple[float, int]:
    return (job.expected_s or 0.0, job.id)


POLICIES: dict[str, Callable[[], Policy]] = {
    "memgov": Memgov,
    "fifo-exclusive": FifoExclusive,
    "sjf-exclusive": SjfExclusive,
    "fifo": Fifo,
    "bestfit": BestFit,
    "tetris": Tetris,
}
DEFAULT = "memgov"


def get(name: str | None) -> Policy:
    """A policy by name; an unknown one says which are accepted."""
    key = (name or DEFAULT).strip().lower()
    if key not in POLICIES:
        raise ConfigError(f"queue policy {name!r}: accepted {', '.join(POLICIES)}")
    return POLICIES[key]()
