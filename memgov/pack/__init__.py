"""memgov pack: run N copies of an experiment on one GPU, governed, and report how it went.

    from memgov.pack import PackConfig, run

    outcome = run(PackConfig("experiments/mnist", n=8, device="cpu", epochs=1))
    outcome.report["aggregate_samples_per_s"], outcome.report["jobs"][0]["reason"]

The command ``memgov pack`` is a thin layer over :func:`run`; docs/pack.md describes both.
Importing this package imports no framework, no matplotlib and no rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memgov.pack.config import PackConfig
    from memgov.pack.engine import Observer, Outcome
    from memgov.pack.manifest import ManifestError
    from memgov.pack.runners import RunnerError

__all__ = ["ManifestError", "PackConfig", "RunnerError", "run"]


def run(cfg: PackConfig, observer: Observer | None = None, write_files: bool = True) -> Outcome:
    """Run a pack; with ``write_files`` also write report.json, report.csv and plot.png into
    ``cfg.out`` (a partial report too, after Ctrl-C). Returns the report and any interrupt."""
    from memgov.pack import engine, report

    writer: Any = report.write if write_files else None
    return engine.pack(cfg, observer, writer)


_LAZY = {"PackConfig": "config", "ManifestError": "manifest", "RunnerError": "runners"}


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m memgov.pack.config` (the docs' option table) runs its module once.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memgov.pack' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"memgov.pack.{module}"), name)
    globals()[name] = value
    return value
