"""memgov pack: run N copies of an experiment on one GPU, governed, and report how it went.

    from memgov.pack import PackConfig, run

    outcome = run(PackConfig("experiments/mnist", n=8, device="cpu", epochs=1))
    outcome.report["aggregate_samples_per_s"], outcome.report["jobs"][0]["reason"]

The command ``memgov pack`` is a thin layer over :func:`run`; docs/pack.md describes both.
Importing this package imports no framework, no matplotlib and no rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memgov.pack.config import PackConfig
from memgov.pack.manifest import ManifestError
from memgov.pack.runners import RunnerError

if TYPE_CHECKING:
    from memgov.pack.engine import Observer, Outcome

__all__ = ["ManifestError", "PackConfig", "RunnerError", "run"]


def run(cfg: PackConfig, observer: Observer | None = None, write_files: bool = True) -> Outcome:
    """Run a pack; with ``write_files`` also write report.json, report.csv and plot.png into
    ``cfg.out`` (a partial report too, after Ctrl-C). Returns the report and any interrupt."""
    from memgov.pack import engine, report

    writer: Any = report.write if write_files else None
    return engine.pack(cfg, observer, writer)
