"""Host memory admission: pack starts a job only when the host can hold it.

Nothing else limits how many trainers start without MPS (whose client limit caps a run): with a
large ``--n`` the host could run out of RAM before the GPU does (an H200 host, measured: ~145
torch jobs by host memory, 161 by GPU footprint; results/HISTORY.md), and the kernel's OOM
killer then picks victims, which may be pack, a neighbour's job or the user's shell. So a job
starts only when

    available - sum(growth still ahead of each running job) - reserve >= per_job

``available`` is the kernel's MemAvailable (free memory plus reclaimable cache). A running job's
growth is ``per_job`` minus its largest measured USS so far (all of ``per_job`` until the sampler
has seen it): jobs just started have not reached their size, and counting only what they hold
now would let a burst of starts overshoot. ``reserve`` is left for everything else:
max(2 GiB, 5 % of RAM), and it is the estimate's margin too (a job that grows past ``per_job``
is in ``available`` as soon as it does). ``per_job`` is, in this order: ``--host-per-job``; the
largest host USS (memory only that process holds; the shared libraries are in ``available``
once) recorded for this experiment, framework, batch, device kind and runner by earlier packs;
this pack's own solo job once it has run (pack's first run on a fresh machine measures it before
the packed runs start); else 2 GiB.

Once jobs of the run are past their first epoch, their largest USS replaces the estimate (and
they have no growth ahead), unless the user gave it: measured beats estimated.

A job that does not fit waits until running jobs end (the run goes on in waves); when nothing
runs and it still does not fit, it is not started and fails with reason ``host_memory``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memgov._base.sizes import format_size

DEFAULT_PER_JOB = 2 * 2**30
RESERVE_MIN = 2 * 2**30
RESERVE_FRACTION = 0.05
DEFAULT_SOURCE = "default: no host USS measured yet"
USER_SOURCE = "--host-per-job"


def reserve_for(total: int) -> int:
    return max(RESERVE_MIN, int(total * RESERVE_FRACTION))


@dataclass
class HostGate:
    per_job: int
    source: str
    reserve: int
    deferred: set[str] = field(default_factory=set)
    """Jobs whose start waited for memory at least once."""
    refused: int = 0
    most_running: int = 0

    def fits(self, running: Iterable[tuple[int | None, bool]]) -> bool:
        """Whether one more job fits beside ``running``: (largest USS so far, past its first
        epoch) for each running job of this run.

        Unless the user gave the estimate, jobs past their first epoch are measured, not
        estimated (at its start a forked job held 176 MiB, after its first epoch ~595): their
        largest USS becomes the estimate (the solo job ran with every core's threads and held
        1,003 MiB where each of 140 packed ones held ~595, H200), and they have no growth ahead
        (what they still grow, the reserve holds)."""
        import psutil

        jobs = list(running)
        learns = self.source != USER_SOURCE
        trained = [uss for uss, training in jobs if training and uss]
        if learns and trained and max(trained) != self.per_job:
            self.per_job = max(trained)
            self.source = (
                f"the largest host USS of this run's jobs past their first epoch ({len(trained)})"
            )
        growth = sum(
            max(0, self.per_job - (uss or 0)) for uss, training in jobs if not (learns and training)
        )
        available = psutil.virtual_memory().available
        return available - growth - self.reserve >= self.per_job

    def learn(self, uss: int | None) -> None:
        """This pack's solo job peaked at ``uss`` bytes of host USS: the estimate from now on,
        unless the user gave one or earlier packs recorded one."""
        if uss and self.source == DEFAULT_SOURCE:
            self.per_job = uss
            self.source = f"this pack's solo job: host USS peak {format_size(uss)}"

    def reset(self) -> None:
        """Start counting afresh for the next run of the pack."""
        self.deferred, self.refused, self.most_running = set(), 0, 0

    def started(self, running: int) -> None:
        self.most_running = max(self.most_running, running)

    def refusal(self) -> str:
        import psutil

        return (
            f"not started: host memory. One job needs ~{format_size(self.per_job)} "
            f"({self.source}); {format_size(psutil.virtual_memory().available)} available, "
            f"{format_size(self.reserve)} kept free, and no job of this run was left to "
            "finish. Free host memory, or pass a smaller --host-per-job if the estimate "
            "is too high"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "per_job_mib": round(self.per_job / 2**20, 1),
            "source": self.source,
            "reserve_mib": round(self.reserve / 2**20, 1),
            "jobs_that_waited": len(self.deferred),
            "refused": self.refused,
            "most_running": self.most_running,
        }


def gate(setting: str | None, recorded: list[int], total: int) -> HostGate | None:
    """The gate for ``--host-per-job`` (None or "auto": from ``recorded`` peaks; "off": none)."""
    from memgov._base.sizes import parse_size

    text = (setting or "auto").strip().lower()
    if text == "off":
        return None
    reserve = reserve_for(total)
    if text != "auto":
        return HostGate(parse_size(text), USER_SOURCE, reserve)
    if recorded:
        top = max(recorded)
        return HostGate(top, f"largest of {len(recorded)} recorded host USS peak(s)", reserve)
    return HostGate(DEFAULT_PER_JOB, DEFAULT_SOURCE, reserve)
