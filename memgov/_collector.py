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

Every pause is recorded with the thread that made it, so a child forked by another thread (where
that pause never ends) gets its collector back on at the fork. Imports stay at os/gc/threading:
auto-enable imports this as the first framework import begins.
"""

from __future__ import annotations

import gc
import os
import threading

_lock = threading.Lock()
_pauses: dict[object, tuple[int, bool]] = {}
"""The collector's pauses in progress: key (a framework's name, or a :class:`Paused`) -> (the
thread that paused it, whether the collector was on before)."""
frozen = 0
"""Objects this process froze (auto-enable's ``outcome["gc_frozen"]``)."""


def pause(key: object) -> None:
    """Turn the collector off until :func:`resume` (``key``); recorded before it is turned off,
    so a fork at any moment in between finds it."""
    entry = (threading.get_ident(), gc.isenabled())
    with _lock:
        _pauses[key] = entry
    gc.disable()


def resume(key: object, freeze: bool = False) -> None:
    """End the pause ``key`` (none: nothing to do): with ``freeze``, collect once and freeze
    what is alive; the collector on again if it was on when the pause began."""
    global frozen
    with _lock:
        entry = _pauses.pop(key, None)
    if entry is None:
        return
    try:
        if freeze:
            gc.collect()
            before = gc.get_freeze_count()
            gc.freeze()
            frozen += gc.get_freeze_count() - before
    finally:  # an interrupt in the collection must not leave the collector off
        if entry[1]:
            gc.enable()


def paused(key: object) -> bool:
    with _lock:
        return key in _pauses


class Paused:  # a class, not contextlib: imported as a framework's import begins
    """The collector paused for the block (memgov's own work at the import's end: its ~5,600
    new objects would otherwise bring a full collection of the framework's heap)."""

    def __enter__(self) -> None:
        pause(self)

    def __exit__(self, *exc: object) -> None:
        resume(self)


def _forget_in_child() -> None:
    # A pause another thread made never ends in the child (that thread does not exist there):
    # without this, a child forked mid-import would run with its collector off for good. The
    # forking thread's own pauses end as they would in the parent.
    global _lock
    _lock = threading.Lock()
    me = threading.get_ident()
    for key, (thread, was_on) in list(_pauses.items()):
        if thread != me:
            del _pauses[key]
            if was_on:
                gc.enable()


os.register_at_fork(after_in_child=_forget_in_child)
