"""What one host-level decision sees: the ready jobs and each GPU with what runs on it.

The queue (`memgov queue run`/`serve`), `memgov pack` and the Ray driver each build a
:class:`View` (their front ends of memgov/queue/engine.py); the decision core turns it into the
cluster model the trace simulator uses (memgov/decide/model.py, one single-GPU node per GPU) and
places its jobs with the same policy code (memgov/decide/core.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from memgov.decide.learn import Learned


@dataclass
class Candidate:
    id: int
    kind: str
    claim: int
    """Bytes it asks for on its GPU."""
    expected_s: float | None
    """Its expected solo time (learned, or the job's hint); None when unknown."""
    gpu: int | None
    """A pin to this GPU index, or None."""
    util: float = 1.0
    """GPU utilisation it needs alone (0-1); 1 unless measured."""
    arrival: float = 0.0
    """When it became ready (wall time)."""


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
    """Bytes the front end may still place here now (the ledger's free budget, others counted)."""
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
"""(job id, GPU index)."""


class Book(Protocol):
    """What one host decision has placed so far, as a policy's ``rank`` and ``admits`` read it
    (memgov/decide/core.py keeps it)."""

    view: View
    free: dict[int, int]
    """Bytes each GPU (by index) still has, this decision's placements counted."""

    def busy(self, gpu: Gpu) -> bool: ...

    def kinds_on(self, gpu: Gpu) -> list[str]: ...

    def members_on(self, gpu: Gpu) -> list[tuple[str, float]]:
        """(kind, utilisation) of each job on ``gpu``, running or placed now."""
        ...

    def end_of(self, run: Running, gpu: Gpu) -> float:
        """When a running job is expected to end."""
        ...

    def reservation(self, policy: Any) -> tuple[Candidate, int, float] | None:
        """(job, GPU index, when) the policy keeps for a job that waited too long."""
        ...
