"""The public contract between memgov and a framework adapter (the only memgov module adapters use).

An adapter makes one framework keep to a claim's budget. It is a class with no constructor
arguments, published in the entry-point group :data:`GROUP` (``memgov.adapters``) under the name
of its framework's top-level module; memgov finds it there, so a new framework is a folder and an
entry point (docs/adapters.md, docs/architecture.md). What memgov's front ends know of the
framework (auto-enable, ``memgov pack``, ``memgov doctor``) is the adapter's :class:`Facts`.
tests/adapters/test_contract.py checks every installed adapter against this contract.

Each adapter sees one :class:`Budget` twice: ``configure_env`` before its framework is imported
(environment only), and ``apply`` once the framework is imported (right away if it already is,
else from an import hook that runs right after ``import <framework>`` returns), before the
framework touches the GPU. An adapter module must not import its framework at module level: memgov
loads every adapter in every governed process, and loading must stay cheap and never initialise
CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from memgov._base.importhook import GROUP
from memgov._base.sizes import format_size, parse_size

__all__ = [
    "GROUP",
    "Adapter",
    "Budget",
    "Facts",
    "Report",
    "budget_view",
    "format_size",
    "own_device_memory",
    "parse_size",
    "setting",
]

Report = Callable[[str], None]
"""Replaces an adapter's report line later (a claim's ``reports`` and auto mode show the latest)."""


def _ignore(_line: str) -> None:
    """The report hook of a budget that nobody listens to (e.g. one built in a test)."""


@dataclass(frozen=True)
class Budget:
    """What a claim asks of the frameworks in this process."""

    bytes: int | None
    """Whole-process device memory (NVML's view, CUDA context included); None = growth only."""
    device_uuid: str
    device_total: int
    device_index: int | None
    """The device's index in this process's frameworks (cuda:N); None for simulated devices."""
    simulated: bool
    name: str
    """The claim's name (for messages)."""
    threads: int | None = None
    """CPU threads this process may use (MEMGOV_THREADS or memgov pack); None = leave as is."""
    hard: bool = False
    """True when the GPU driver also enforces ``bytes`` (MPS pinned limit)."""
    report: Report = field(default=_ignore, compare=False, repr=False)
    """Call with a new one-line report when the adapter's work finishes after ``apply`` returned
    (torch caps its allocator only when CUDA initialises). memgov binds it to this adapter."""


@dataclass(frozen=True)
class Facts:
    """What memgov's front ends know of one framework: the adapter's ``facts`` attribute, the one
    table that auto-enable, ``memgov pack`` and ``memgov doctor`` read (docs/adapters.md)."""

    distributions: tuple[str, ...] = ()
    """Whose versions ``memgov doctor`` lists (default: the module's name)."""
    env: tuple[str, ...] = ()
    """Its own memory and thread variables: doctor shows them, pack's greedy jobs drop them."""
    greedy_env: Mapping[str, str] = field(default_factory=dict)
    """Its defaults where ``import memgov`` changes them, for greedy jobs in memgov's image."""
    default_claim: int | None = None
    """Bytes per job of ``memgov pack --claim auto`` with no history (None: 1 GiB)."""
    forkable: bool = False
    """Its import leaves no thread running through fork (``pack --runner preload``)."""
    extra: str | None = None
    """The memgov-gpu extra that installs it (pack's hint for a job that lacks it)."""
    compile_cache_dir: str | None = None
    """The variable naming its persistent compilation cache, where pack can share one."""
    compile_cache_env: Mapping[str, str] = field(default_factory=dict)
    """That cache's other settings for pack's jobs."""


@runtime_checkable
class Adapter(Protocol):
    """One framework's adapter. ``apply`` reports start with ``f"{name}: "``."""

    name: str
    """The entry point's name, and the key of this adapter's line in ``Claim.reports``."""
    module: str
    """Top-level module whose import triggers ``apply`` (e.g. "torch"): the entry point's name,
    which auto-enable reads without loading the adapter."""

    def configure_env(self, budget: Budget) -> str | None:
        """Set environment variables the framework reads at import or start-up. No imports.

        Returns a report line, or None when ``apply`` will report.
        """

    def apply(self, budget: Budget) -> str:
        """Make the imported framework respect the budget; return a one-line report."""

    def cuda_initialized(self) -> bool:
        """Whether this framework has initialised CUDA in this process. Never imports it."""

    # Optional: ``facts``, a :class:`Facts` (absent: ``Facts()``).
    #
    # Optional: ``lower(budget) -> str | None``. A claim that gives memory back (a first-run
    # ``auto`` claim, docs/profiles.md) calls it with the smaller budget once the framework is
    # imported; it returns a report line when its cap now fits, None when it cannot lower it. An
    # adapter without it (JAX, TensorFlow: limits fixed at start-up) keeps the claim as it was.
    #
    # Optional, for the budget views (docs/adapters.md, "What a governed process sees"):
    # ``device_use(budget) -> int | None``: what this framework holds on the device as it knows
    # it (allocator reserved + the overhead it keeps for context and libraries), None when it has
    # not started there; ``release()``: undo the views ``apply`` installed (the claim ended).


def own_device_memory(device_uuid: str) -> int | None:
    """This process's device memory on ``device_uuid`` as NVML counts it, or None if not listed.

    None also when NVML is unavailable, or cannot name this process (inside a PID namespace NVML
    lists host PIDs, so the figure may be missing or, rarely, another process's: check it is
    plausible before use).
    """
    import os

    from memgov._gpu import nvml as _nvml  # lazy: NVML is initialised on first use, never at import

    return (_nvml.processes(device_uuid) or {}).get(os.getpid())


def budget_view(device_uuid: str, driver_free: int | None = None) -> tuple[int, int] | None:
    """(free, total) that ``device_uuid`` shows inside this process's claim, or None (then report
    the driver's own figures): no claim with a budget held on it, or MEMGOV_VIEWS=off.

    total = the budget; free = the budget minus this process's use (the larger of NVML's figure
    for this process and the adapters' ``device_use``), never more than ``driver_free``, the
    device's own free figure where the caller has it (neighbours over their budgets, MPS's limit).
    """
    from memgov import _adapters

    return _adapters.view(device_uuid, driver_free)


def setting(name: str) -> Any:
    """The parsed value of a MEMGOV_* setting (its row in memgov's settings table, e.g.
    MEMGOV_TORCH_MARGIN; None when unset); raises memgov.ConfigError naming the variable and what
    it accepts. An adapter's own variable gets a row there, so docs and ``memgov doctor`` list it.
    """
    from memgov._base import settings as _settings

    return _settings.get(name)


# -- The CPU thread budget, for adapters whose framework sizes its own thread pools -------------
ThreadFollower = Callable[[int], "tuple[int, str] | None"]
"""Called on the main thread with the new share; returns (threads, why) when the user took over
(memgov stops following then), else None."""


def threads_now(default: int | None) -> int | None:
    """The thread count to apply now: the followed share may have moved since the claim."""
    from memgov._cpu import threads as _threads

    return _threads.now(default)


def on_threads_change(callback: ThreadFollower) -> None:
    """Run ``callback(threads)`` on the main thread whenever this process's share changes."""
    from memgov._cpu import threads as _threads

    _threads.on_change(callback)


def imported_before_claim() -> list[str]:
    """Frameworks imported before the thread budget was decided: the user may have set their
    threads already, and that choice wins."""
    from memgov._cpu import threads as _threads

    return _threads.preloaded()
