"""Waiters wake for the removals that can let them in, not for a flood's (memgov/_wake.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memgov._wake import Waker


def test_only_a_wanted_removal_wakes_a_waiter(tmp_path: Path) -> None:
    claims, queue = tmp_path / "claims", tmp_path / "queue"
    claims.mkdir()
    queue.mkdir()
    flood = [claims / f"flood-{i}.json" for i in range(500)]
    for path in [*flood, claims / "held.json", queue / "ahead.json"]:
        path.write_text("x")
    waker = Waker([claims, queue])
    if waker._file is None:
        pytest.skip("no inotify here: waiters sleep on their timeout alone")
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
