"""A queued job: what to run (command, folder, environment, claim) and what happened to it.

One :class:`Job` is one file of the user's queue store (memgov/queue/store.py), rewritten whole
at every change of state::

    queued -> running -> done | failed | cancelled
                 |
                 +-> queued again (an OOM under a learned size, at most MAX_RETRIES times; a run
                     stopped by the runner's own shutdown; a start that provably never happened)

Each start is an *attempt* (its claim, GPU, times and how it ended); the report is built from
them. Queue files (TOML) become jobs through :func:`memgov.queue.queuefile.load`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from memgov._base.errors import QueueError

VERSION = 1
STATES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = ("done", "failed", "cancelled")
ENDS = ("ok", "failed", "oom", "killed", "cancelled", "stopped", "lost", "not_started")
"""How an attempt ended: ok (exit 0), failed (another exit), oom (ran out of memory), killed (a
signal from outside), cancelled (``memgov queue cancel``), stopped (the runner's own shutdown:
re-queued), lost (its runner and shepherd died while it ran: whether it finished is unknown),
not_started (its shepherd died before starting it: re-queued)."""
MAX_RETRIES = 2
"""Re-tries of a job that ran out of memory under a learned (``auto``) size."""
OOM_GROWTH = 1.5
"""Each re-try claims this much more than the attempt that ran out of memory."""


@dataclass
class Attempt:
    n: int
    claim_bytes: int
    gpu: int
    device: str
    live: str
    """The name of the shepherd's live record (memgov/queue/store.py)."""
    start: float = 0.0
    end: float | None = None
    result: str | None = None
    """One of ENDS once the attempt ended."""
    returncode: int | None = None
    signal: int | None = None
    pid: int | None = None
    peak_bytes: int | None = None
    sharing: float | None = None
    """Time-weighted count of other queue jobs on its GPU while it ran."""
    detail: str = ""


@dataclass
class Job:
    id: int
    name: str
    cmd: list[str]
    cwd: str
    env: dict[str, str]
    claim: str | int = "auto"
    """"auto" (sized from the job's profile), bytes, or a percentage of the GPU ("25%")."""
    arrival: float = 0.0
    duration: float | None = None
    kind: str = ""
    gpu: int | None = None
    batch: str = ""
    """The run (a queue file's run) the job belongs to; empty for ``memgov queue add``."""
    created: float = 0.0
    not_before: float = 0.0
    """Wall time before which the runner does not start it (its arrival)."""
    job: str = ""
    """Its name in the profile store (memgov/_profiles/jobid.py), which sizes ``auto`` claims."""
    state: str = "queued"
    attempts: list[Attempt] = field(default_factory=list)
    retries: int = 0
    ooms: int = 0
    cancel: bool = False
    """``memgov queue cancel`` asked a running job to stop."""
    next_claim: int | None = None
    """The claim of the next attempt after an OOM (x OOM_GROWTH)."""

    @property
    def label(self) -> str:
        return f"{self.id} ({self.name})"

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Job:
        """A job from its file's content; QueueError naming ``where`` when it is not one."""
        try:
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise TypeError(f"not a version {VERSION} queue job")
            fields = {k: v for k, v in data.items() if k != "version"}
            fields["attempts"] = [Attempt(**a) for a in fields.get("attempts", [])]
            job = cls(**fields)
            _check(job)
        except (TypeError, ValueError) as exc:
            raise QueueError(
                f"queue job {where} is not a memgov queue job ({str(exc)[:160]}); it is left as "
                "it is: move it away, or `memgov queue cancel ID` removes it"
            ) from None
        return job


def _check(job: Job) -> None:
    if type(job.id) is not int or job.id < 1:
        raise ValueError("bad id")
    if not isinstance(job.cmd, list) or not job.cmd or not all(isinstance(a, str) for a in job.cmd):
        raise ValueError("cmd is not a list of strings")
    if not isinstance(job.env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in job.env.items()
    ):
        raise ValueError("env is not a table of strings")
    if job.state not in STATES:
        raise ValueError(f"state {job.state!r}")
    percent = isinstance(job.claim, str) and job.claim.strip().endswith("%")
    if not (job.claim == "auto" or percent or (type(job.claim) is int and job.claim > 0)):
        raise ValueError(f"claim {job.claim!r}")
    for attempt in job.attempts:
        if attempt.result is not None and attempt.result not in ENDS:
            raise ValueError(f"attempt end {attempt.result!r}")
