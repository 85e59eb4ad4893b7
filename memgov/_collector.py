"""The garbage collector around a governed framework import: paused through it, then frozen.

``import torch`` leaves ~170,000 objects the collector tracks. Collected as usual, the import runs
hundreds of collections over its own growing heap (two of them full), and every full collection
after it walks all those objects again (60-80 ms of CPU each on the CPU machine; on the H200 the
public scripts' four full collections cost each job 0.275-0.343 s). Auto-enable pauses the
collector from the framework import's start to its end; at the end it collects once (the
import's own garbage, ~7,000 objects, and any other thread's, is freed, not kept for good) and
freezes what is alive (``gc.freeze()``: the permanent generation). Later full collections skip
those objects, and a forked DataLoader worker's collections never write to their headers, which
would copy the parent's pages (Python's documentation recommends freezing before ``fork()`` for
that; pack's preload zygote does the same). results/cpu-2core/2026-11-29-gc-freeze.txt.

What a frozen object gives up: it is still freed when its last reference goes, but a reference
cycle among frozen objects that the program drops later is never collected, and
``gc.get_objects()`` / ``gc.get_referrers()`` do not list frozen objects (leak hunters such as
``jax.checking_leaks`` and objgraph see less). Those are the objects alive when the import ended:
the framework's modules and what the program made before it. MEMGOV_GC_FREEZE=off leaves the
collector alone.

A program that turned the collector off itself keeps it off and gets no collection from memgov.
A child forked while a pause is in progress gets its collector back at the fork, with no freeze
(the pause may never end there). Imports stay at os/gc/threading: auto-enable imports this as the
first framework import begins.
"""

from __future__ import annotations

import gc
import os
import threading

_lock = threading.RLock()  # re-entrant: a finalizer run by a collection may pause again
_pauses: dict[object, int] = {}
"""The collector's pauses in progress: key (a framework's name, or a :class:`Paused`) -> the
thread that made it. The collector is off while any is in progress."""
_was_on = False
"""Whether the collector was on when the first of the pauses in progress began."""
frozen = 0
"""Objects this process froze (auto-enable's ``outcome["gc_frozen"]``)."""


def pause(key: object) -> None:
    """Turn the collector off until :func:`resume` (``key``). Recorded before the collector goes
    off and dropped only after it is back on, under one lock: a fork by another thread at any
    moment finds a pause in progress or the collector as it was."""
    global _was_on
    with _lock:
        if not _pauses:
            _was_on = gc.isenabled()
        _pauses[key] = threading.get_ident()
        gc.disable()


def resume(key: object, freeze: bool = False) -> None:
    """End the pause ``key`` (none: nothing to do): with ``freeze``, collect once and freeze
    what is alive (not where the program had turned the collector off itself: it gets no
    collection from memgov); the collector on again once no pause is in progress, if it was on
    when they began."""
    global frozen
    with _lock:
        if key not in _pauses:
            return
        freeze = freeze and _was_on
    try:
        if freeze:
            gc.collect()
            before = gc.get_freeze_count()
            gc.freeze()
            frozen += gc.get_freeze_count() - before
    finally:  # an interrupt in the collection must not leave the collector off
        with _lock:
            if _pauses.keys() == {key} and _was_on:
                gc.enable()  # before the record goes: a fork in between still finds it
            _pauses.pop(key, None)


class Paused:  # a class, not contextlib: imported as a framework's import begins
    """The collector paused for the block (memgov's own work at the import's end: its ~5,600
    new objects would otherwise bring a full collection of the framework's heap)."""

    def __enter__(self) -> None:
        pause(self)

    def __exit__(self, *exc: object) -> None:
        resume(self)


def _forget_in_child() -> None:
    # The child of a fork made while pauses were in progress gets its collector back at once:
    # a pause another thread made never ends there (that thread does not exist), and one the
    # forking thread made ends only if the child goes back through that import's end, which a
    # multiprocessing child (it runs its target, then exits) never does. No freeze in the child.
    global _lock
    _lock = threading.RLock()
    if not _pauses:
        return  # no pause in progress: the program's own setting stands
    _pauses.clear()
    if _was_on:
        gc.enable()


os.register_at_fork(after_in_child=_forget_in_child)
