"""The engine's decision step (memgov/queue/engine.py), the loop memgov queue and memgov pack
both run: every policy respects the front end's gates, the engine checks placements against the
free budget and the gates again whatever the policy did, and a job no gate admits on an idle host
is refused with the gate's reason instead of waiting for ever. The front ends' own tests run it
with real processes (tests/queue/test_queue_runner.py, tests/pack/test_pack_hostmem.py)."""

from __future__ import annotations

import pytest

from memgov import decide
from memgov.decide import Candidate, Gpu
from memgov.queue import engine as engine_module
from memgov.queue.engine import Engine

GIB = 2**30


class Front:
    """A front end that keeps what the engine asked of it: its jobs start and run until the test
    ends them."""

    def __init__(self, jobs: list[Candidate], gpus: int = 2, free: int = 80 * GIB) -> None:
        self.learned = decide.Learned()
        self.ready = list(jobs)
        self.free = {i: free for i in range(gpus)}
        self.on: dict[int, list[Candidate]] = {i: [] for i in range(gpus)}
        self.started: list[tuple[int, int]] = []
        self.refused: list[tuple[int, str]] = []
        self.waiting: list[list[int]] = []
        self.halted: list[BaseException | None] = []

    def view(self, now: float) -> tuple[list[Candidate], list[Gpu]] | None:
        gpus = [
            Gpu(
                i,
                80 * GIB,
                self.free[i],
                [decide.Running(c.id, c.kind, c.claim, now, None) for c in self.on[i]],
            )
            for i in self.free
        ]
        return list(self.ready), gpus

    def start(self, job_id: int, gpu: int, claim: int) -> None:
        job = next(c for c in self.ready if c.id == job_id)
        self.ready.remove(job)
        self.on[gpu].append(job)
        self.free[gpu] -= claim
        self.started.append((job_id, gpu))

    def refuse(self, job_id: int, why: str) -> None:
        self.ready = [c for c in self.ready if c.id != job_id]
        self.refused.append((job_id, why))

    def held(self, waiting: list[Candidate]) -> None:
        self.waiting.append([c.id for c in waiting])

    def active(self) -> int:
        return sum(len(jobs) for jobs in self.on.values())

    def follow(self) -> bool:
        return bool(self.ready)

    def wait(self) -> None:
        return None

    def halt(self, error: BaseException | None) -> None:
        self.halted.append(error)


class PerGpu:
    """A gate: at most ``most`` jobs on a GPU; ``never`` refuses every job on an idle host."""

    def __init__(self, front: Front, most: int, never: str | None = None) -> None:
        self.front, self.most, self.never = front, most, never
        self.begun = 0
        self.running: dict[int, int] = {}

    def begin(self) -> None:
        self.begun += 1
        self.running = {i: len(jobs) for i, jobs in self.front.on.items()}

    def admits(self, job: Candidate, gpu: Gpu, placed: list[Candidate]) -> bool:
        if self.never is not None:
            return False
        return self.running[gpu.index] + len(placed) < self.most

    def refusal(self, job: Candidate) -> str | None:
        return self.never


def small(n: int) -> list[Candidate]:
    return [Candidate(i, "small", GIB, 10.0, None, arrival=0.0) for i in range(n)]


@pytest.mark.parametrize("name", list(decide.POLICIES))
def test_every_policy_places_only_where_the_gates_admit(name: str) -> None:
    front = Front(small(10))
    gate = PerGpu(front, most=2)
    engine = Engine(front, decide.get(name), [gate], cores=16)
    engine.decide()
    per_gpu = [len(front.on[i]) for i in front.on]
    assert max(per_gpu) <= 2 and front.started, (name, per_gpu)
    assert gate.begun == 1 and len(engine.latencies) == 1
    assert front.waiting == [[c.id for c in front.ready]]  # the rest wait, in order
    assert not front.refused


def test_the_engine_checks_budget_and_gates_again_whatever_the_policy_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A decision that ignores budgets and gates: every ready job on GPU 0.
    monkeypatch.setattr(engine_module, "place", lambda policy, view: [(c.id, 0) for c in view.jobs])
    jobs = small(6)
    jobs[1].claim = 50 * GIB  # 1 GiB + 50 GiB fit 60 GiB; the next 1 GiB jobs fit, up to the gate
    front = Front(jobs, gpus=1, free=60 * GIB)
    engine = Engine(front, decide.get("fifo"), [PerGpu(front, most=4)])
    engine.decide()
    assert front.started == [(0, 0), (1, 0), (2, 0), (3, 0)]
    front.free[0] = 0
    engine.decide()  # no budget left: nothing more, whatever the policy says
    assert len(front.started) == 4 and not front.refused


def test_a_job_no_gate_admits_on_an_idle_host_is_refused_with_the_reason() -> None:
    front = Front(small(3))
    engine = Engine(front, decide.get("fifo"), [PerGpu(front, 1, never="too big for this host")])
    engine.run(lambda: False)  # refused, in order, then nothing is left: the loop ends
    assert front.refused == [(i, "too big for this host") for i in range(3)]
    assert not front.started and not front.waiting


def test_a_job_a_gate_holds_while_others_run_waits_and_is_not_refused() -> None:
    front = Front(small(3), gpus=1)
    front.start(0, 0, GIB)  # one runs already
    gate = PerGpu(front, most=1)
    engine = Engine(front, decide.get("fifo"), [gate])
    assert engine.decide() == []
    assert front.waiting == [[1, 2]] and not front.refused
    assert engine.decisions()["count"] == 1


def test_the_loop_halts_what_runs_when_stopped_or_on_an_exception() -> None:
    front = Front(small(4), gpus=1)
    engine = Engine(front, decide.get("fifo"), [PerGpu(front, most=2)])
    engine.run(lambda: len(front.started) >= 2)  # a signal's flag, seen after two started
    assert front.halted == [None] and len(front.started) == 2

    def broken() -> None:
        raise KeyboardInterrupt

    front.wait = broken  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        engine.run(lambda: False)
    assert len(front.halted) == 2 and isinstance(front.halted[1], KeyboardInterrupt)
