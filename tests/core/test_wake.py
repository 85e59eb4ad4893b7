"""Waiters wake for the removals that can let them in, not for a flood's
(memgov/_ledger/wake.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memgov._ledger.wake import Waker


def flooded(tmp_path: Path, count: int) -> tuple[Path, Path, list[Path], Waker]:
    """claims/ with ``count`` flood files and one held record, queue/ with the ticket ahead, and
    a waker watching both."""
    claims, queue = tmp_path / "claims", tmp_path / "queue"
    claims.mkdir()
    queue.mkdir()
    flood = [claims / f"flood-{i}.json" for i in range(count)]
    for path in [*flood, claims / "held.json", queue / "ahead.json"]:
        path.write_text("x")
    waker = Waker([claims, queue])
    if waker._file is None:
        pytest.skip("no inotify here: waiters sleep on their timeout alone")
    return claims, queue, flood, waker


def test_only_a_wanted_removal_wakes_a_waiter(tmp_path: Path) -> None:
    claims, queue, flood, waker = flooded(tmp_path, 500)
    watch = {claims: frozenset({"held.json"}), queue: frozenset({"ahead.json"})}

    def wanted(folder: Path, name: str) -> bool:
        return name in watch.get(folder, frozenset())

    try:
        for path in flood:  # another user's gc clearing a flood
            path.unlink()
        assert waker.sleep(0.0, wanted) is False  # read and dropped: no wake-up
        (claims / "held.json").unlink()  # a claim the waiter counted is released
        assert waker.sleep(5.0, wanted) is True
        (queue / "ahead.json").unlink()  # the ticket ahead leaves
        assert waker.sleep(5.0, wanted) is True
        (claims / "other.json").write_text("x")
        (claims / "other.json").unlink()
        assert waker.sleep(5.0) is True  # no filter: any removal wakes it
    finally:
        waker.close()


def test_a_folder_out_of_focus_neither_wakes_nor_delays_a_waiter(tmp_path: Path) -> None:
    """A waiter behind others watches queue/ alone: a flood's removals in claims/ (root's gc
    clearing it) must not keep it napping when the ticket ahead goes."""
    claims, queue, flood, waker = flooded(tmp_path, 200)
    try:
        waker.focus([queue])
        for path in flood:
            path.unlink()
        (claims / "held.json").unlink()
        assert waker.sleep(0.0) is False  # nothing from claims/ is even read: no wake-up
        (queue / "ahead.json").unlink()
        assert waker.sleep(5.0) is True  # the queue's removal wakes it, unfiltered
        waker.focus([claims, queue])  # first in line now: claims/ is watched again
        (claims / "again.json").write_text("x")
        (claims / "again.json").unlink()
        assert waker.sleep(5.0) is True
    finally:
        waker.close()
