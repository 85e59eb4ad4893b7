"""`memgov pack`'s live progress on stderr: per run, jobs finished and epochs done, with an ETA.

Epochs advance in fractions between epoch reports, from the trainers' "progress" reports (every
2 s within an epoch), so a long CPU epoch moves too. On a terminal: rich bars with elapsed time
and time remaining. Without one (CI, `| tee`, a log file): one plain line at most every
PLAIN_EVERY_S seconds and when a run ends, never redrawn, never wrapped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memgov.cli.render import console, one_line

if TYPE_CHECKING:
    from memgov.pack.stats import JobRecord, RunRecord

PLAIN_EVERY_S = 10.0


@dataclass
class _Run:
    label: str
    mode: str
    n: int
    started: float
    epochs: int = 0
    done: dict[str, float] = field(default_factory=dict)
    """Job -> epochs done, fractions included."""
    finished: int = 0
    tasks: tuple[Any, Any] | None = None
    said: float = 0.0

    @property
    def total(self) -> int:
        return self.epochs * self.n

    @property
    def completed(self) -> float:
        return sum(self.done.values())

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        text = f"{self.label} ({self.mode}): {self.finished}/{self.n} jobs done"
        if self.total:
            share = min(1.0, self.completed / self.total)
            text += f", {self.completed:.1f}/{self.total} epochs ({share:.0%})"
            if 0 < share < 1:
                text += f", ETA {_clock(elapsed * (1 - share) / share)}"
        return text + f", {_clock(elapsed)} elapsed"


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class PackProgress:
    """An observer of memgov.pack.run (run_started, job_event, job_ended, run_ended)."""

    def __init__(self) -> None:
        self.console = console(stderr=True)
        self.runs: dict[str, _Run] = {}
        self.bar: Any = None
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.bar.start()

    def run_started(self, plan: Any) -> None:
        mode = f"{plan.mode}{', MPS' if plan.mps else ''}"
        run = _Run(plan.label, mode, plan.n, time.monotonic())
        if self.bar is not None:
            run.tasks = (
                self.bar.add_task(f"{plan.label} ({mode}): jobs done", total=plan.n),
                self.bar.add_task(f"{plan.label}: epochs", total=None),
            )
        self.runs[plan.label] = run

    def job_event(self, plan: Any, job: str, event: dict[str, Any]) -> None:
        run = self.runs[plan.label]
        kind = event.get("event")
        if kind == "start" and isinstance(event.get("epochs"), int):
            run.epochs = max(run.epochs, event["epochs"])
        elif kind == "progress" and event.get("of"):
            run.done[job] = max(0, event.get("epoch", 1) - 1) + event["samples"] / event["of"]
        elif kind == "epoch" and isinstance(event.get("epoch"), int):
            run.done[job] = event["epoch"]
        else:
            return
        self._show(run)

    def job_ended(self, plan: Any, record: JobRecord) -> None:
        run = self.runs[plan.label]
        run.finished += 1
        if record["status"] != "ok":
            self.console.print(
                f"{plan.label} {record['label']} failed: {record['reason']}: "
                f"{one_line(record['detail'])}",
                highlight=False,
                markup=False,
            )
        self._show(run)

    def run_ended(self, plan: Any, record: RunRecord) -> None:
        self._show(self.runs[plan.label], force=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()

    def _show(self, run: _Run, force: bool = False) -> None:
        if self.bar is not None and run.tasks is not None:
            jobs, epochs = run.tasks
            self.bar.update(jobs, completed=run.finished)
            self.bar.update(epochs, total=run.total or None, completed=run.completed)
            return
        now = time.monotonic()
        if force or now - run.said >= PLAIN_EVERY_S:
            run.said = now
            self.console.print(f"memgov pack: {run.line()}", highlight=False, markup=False)
