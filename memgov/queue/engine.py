"""The engine: one loop that decides what starts where, launches it and follows it to its end.

Every tool that runs jobs on the host's GPUs is a front end of this loop (docs/architecture.md,
"One engine"):

- ``memgov queue`` (memgov/queue/runner.py): a user's stored jobs, each attempt launched under a
  shepherd (memgov/queue/shepherd.py) and followed through the store, so a runner's death loses
  nothing; the GPUs' free budget comes from the ledger;
- ``memgov pack`` (memgov/pack/engine.py): N copies of one experiment (and its solo reference),
  launched by pack's runners (a process, a PID namespace, a container, a fork of the zygote) and
  followed through their live reports; started first fit, as its gates allow (jobs at once, the
  host's memory).

The loop is the same for both: the front end says what is ready and what each GPU holds (a
:class:`~memgov.decide.View`), the policy places jobs, the engine checks every placement
against the GPU's free budget and every gate again (no policy can start what does not fit) and
has the front end launch it; a job that no gate would admit on an idle host is refused with the
gate's reason instead of waiting for ever. Then the front end follows what runs (what ended, a
time limit, new work) and waits until something may have changed. When the loop is stopped (a
signal) or an exception ends it, the front end halts what runs. Each decision's latency (the
view and the policy) is kept.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from memgov.decide import Candidate, Gate, Gpu, Policy, View, place
from memgov.decide.learn import Learned
from memgov.queue.report import decision_stats


class Front(Protocol):
    """What a front end gives the engine: its work, how to launch it, how to follow it."""

    learned: Learned

    def view(self, now: float) -> tuple[list[Candidate], list[Gpu]] | None:
        """The jobs that may start now and the GPUs; None when no decision is due."""
        ...

    def start(self, job_id: int, gpu: int, claim: int) -> None:
        """Launch the job on the GPU with this claim (bytes)."""
        ...

    def refuse(self, job_id: int, why: str) -> None:
        """The job can never start here (a gate said why): it ends, not started."""
        ...

    def held(self, waiting: list[Candidate]) -> None:
        """The ready jobs this decision left waiting, in the view's order."""
        ...

    def active(self) -> int:
        """How many of its jobs run now."""
        ...

    def follow(self) -> bool:
        """Take what ended, keep time limits, read new work; False when nothing is left."""
        ...

    def wait(self) -> None:
        """Until something may have changed (a poll interval, a job's message)."""
        ...

    def halt(self, error: BaseException | None) -> None:
        """Stop what runs: the loop was stopped (None) or ``error`` ended it (an interrupt
        raised as an exception, or a bug); the engine raises ``error`` again afterwards."""
        ...


HELD_KEPT = 200
"""The report keeps this many of the jobs held back although a GPU had room (the count is whole)."""


class Engine:
    def __init__(
        self, front: Front, policy: Policy, gates: Sequence[Gate] = (), cores: int | None = None
    ) -> None:
        self.front = front
        self.policy = policy
        self.gates = list(gates)
        self.cores = cores or os.cpu_count() or 1
        self.latencies: list[float] = []
        """Seconds each decision took: the front end's view and the policy."""
        self.held: list[tuple[float, int, int, int, int]] = []
        """(time, job id, GPU, its free bytes, the job's claim): a job left waiting although a
        GPU it may use had room for it, after the decision's own placements (the first
        HELD_KEPT; the policy's hold-backs and reservations, seen from outside)."""
        self.held_count = 0

    def run(self, stopped: Callable[[], bool]) -> None:
        """Decide, launch and follow until the front end has nothing left or ``stopped()``;
        then, if stopped or on an exception, have the front end halt what runs."""
        try:
            while not stopped() and self.front.follow():
                self.decide()
                self.front.wait()
        except BaseException as exc:
            self.front.halt(exc)
            raise
        if stopped():
            self.front.halt(None)

    def decide(self) -> list[int]:
        """One decision: the ids of the jobs started."""
        now = time.time()
        began = time.perf_counter()
        found = self.front.view(now)
        if found is None:
            return []
        ready, gpus = found
        if not ready:
            return []
        for gate in self.gates:
            gate.begin()
        view = View(now, ready, gpus, self.cores, self.front.learned, self.gates)
        placements = place(self.policy, view)
        self.latencies.append(time.perf_counter() - began)
        started = self._launch(view, placements)
        waiting = [c for c in ready if c.id not in started]
        self._note_held(view, waiting, placements, now)
        if waiting and not started and self.front.active() == 0:
            waiting = self._refuse(waiting)
        if waiting:
            self.front.held(waiting)
        return started

    def _launch(self, view: View, placements: list[tuple[int, int]]) -> list[int]:
        """Start each placement that fits its GPU's free budget and every gate (checked here
        again, whatever the policy did)."""
        gpus = {g.index: g for g in view.gpus}
        jobs = {c.id: c for c in view.jobs}
        free = {g.index: g.free for g in view.gpus}
        placed: dict[int, list[Candidate]] = {g.index: [] for g in view.gpus}
        started = []
        for job_id, index in placements:
            job, gpu = jobs[job_id], gpus[index]
            if job.claim > free[index]:
                continue  # the policy overcommitted: never started
            if not all(g.admits(job, gpu, placed[index]) for g in self.gates):
                continue
            free[index] -= job.claim
            placed[index].append(job)
            self.front.start(job_id, index, job.claim)
            started.append(job_id)
        return started

    def _refuse(self, waiting: list[Candidate]) -> list[Candidate]:
        """Nothing runs and nothing started: the jobs a gate would never admit end here, in
        order, up to the first one some gate might still admit. What is left waits."""
        while waiting:
            reasons = [why for g in self.gates if (why := g.refusal(waiting[0])) is not None]
            if not reasons:
                break
            self.front.refuse(waiting[0].id, reasons[0])
            waiting = waiting[1:]
        return waiting

    def _note_held(
        self, view: View, waiting: list[Candidate], placed: list[tuple[int, int]], now: float
    ) -> None:
        claims = {c.id: c.claim for c in view.jobs}
        free = {g.index: g.free for g in view.gpus}
        for job_id, index in placed:
            free[index] -= claims[job_id]
        for job in waiting:
            room = [i for i, f in free.items() if f >= job.claim and job.gpu in (None, i)]
            if room:
                self.held_count += 1
                if len(self.held) < HELD_KEPT:
                    self.held.append((now, job.id, room[0], free[room[0]], job.claim))

    def decisions(self) -> dict[str, Any]:
        """count, p50_ms, p99_ms, max_ms of the decisions so far (as the queue's report)."""
        return decision_stats(self.latencies)
