"""gc rebuilds a claims folder that a flood left large (memgov/_ledger/compact.py): the live claims
go on counting (their locks never drop), releases and waiters work across the rebuild, and where a
rebuild cannot be done whole nothing changes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import memgov
from memgov import _status
from memgov._ledger import compact as _compact, records as _records
from memgov._ledger.wake import Waker
from tests.helpers.folders import keeps_room, plant
from tests.helpers.procs import Child, ledger, wait_until

GIB = 2**30
pytestmark = pytest.mark.usefixtures("sim")

FLOOD = 40_000
"""Empty record-named files: some 1.7 MB of folder entries on ext4, past COMPACT_AT_BYTES."""


def _flood_gone(folder: Path) -> None:
    """The flood's files removed (as gc, or their owner, removes them): their room stays."""
    for name in os.listdir(folder):
        if name.startswith("0000"):  # the flood's names; records' begin with the time
            with contextlib.suppress(FileNotFoundError):  # a waiter's scan removed it first
                os.unlink(folder / name)


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """A quarter of the bound (in this process only: gc run in it), so a quarter of the flood."""
    monkeypatch.setattr(_compact, "COMPACT_AT_BYTES", _compact.COMPACT_AT_BYTES // 4)
    return FLOOD // 4


@pytest.fixture
def claims(private_ledger: Path, tmp_path: Path) -> Path:
    if not keeps_room(tmp_path, FLOOD):
        pytest.skip("this filesystem gives a folder's room back: nothing to rebuild")
    ledger().snapshot()  # the ledger's folders, made as a first claim makes them
    return private_ledger / "v1" / "sim0" / "claims"


def _gc() -> dict[str, list[str]]:
    argv = [sys.executable, "-m", "memgov", "gc", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got: dict[str, list[str]] = json.loads(done.stdout)
    return got


def test_a_bloated_claims_folder_is_rebuilt_with_its_live_claims(
    claims: Path, children: list[Child]
) -> None:
    holder = Child(["40GiB", "--name", "held"])
    children.append(holder)
    holder.expect("admitted")
    plant(claims, FLOOD)
    _flood_gone(claims)
    assert _compact.bloated(os.stat(claims), len(os.listdir(claims)))
    before = os.stat(claims).st_ino
    waiter = Child(["40GiB", "--name", "waiter", "--wait", "120"])
    children.append(waiter)
    book = ledger()
    wait_until(lambda: len(book.snapshot().queue) == 1, timeout=60)  # queued before the rebuild

    gc = _gc()

    assert len(gc["rebuilt"]) == 1 and "1 record(s)" in gc["rebuilt"][0], gc
    after = os.stat(claims)
    assert after.st_ino != before and not _compact.bloated(after, 0)
    (old,) = [p for p in claims.parent.iterdir() if p.name.startswith(_compact.OLD_PREFIX)]
    assert stat.S_IMODE(old.stat().st_mode) == 0o755  # readable, closed to writes
    # The carried record's old name is gone: no name there outlives the record's updates.
    assert set(os.listdir(old)).isdisjoint(os.listdir(claims))
    # The holder's claim counts on (its lock carried over with the file) and still blocks.
    assert [c.name for c in book.snapshot().claims] == ["held"]
    with pytest.raises(memgov.BudgetExceeded):
        memgov.claim("30GiB")
    # Its release works across the rebuild, and the waiter queued before it gets in.
    holder.release()
    holder.expect("released")
    waiter.expect("admitted", timeout=60)
    assert [c.name for c in book.snapshot().claims] == ["waiter"]
    waiter.release()
    waiter.expect("released")
    assert book.snapshot().claims == []


def test_the_old_folder_goes_at_a_later_gc_and_a_small_folder_is_left_alone(
    claims: Path, monkeypatch: pytest.MonkeyPatch, small_bound: int
) -> None:
    plant(claims, small_bound)
    _flood_gone(claims)
    assert len(_status.snapshots(clean=True)[0].rebuilt) == 1
    rebuilt = os.stat(claims).st_ino
    device = claims.parent
    assert any(p.name.startswith(_compact.OLD_PREFIX) for p in device.iterdir())
    monkeypatch.setattr(_compact, "STALE_S", 0.0)
    snap = _status.snapshots(clean=True)[0]
    assert any("left by an earlier rebuild" in line for line in snap.removed), snap.removed
    assert not any(p.name.startswith(_compact.OLD_PREFIX) for p in device.iterdir())
    assert snap.rebuilt == [] and os.stat(claims).st_ino == rebuilt  # small now: left alone


def test_a_users_folder_moves_with_the_rebuild_and_removal_enters_no_folder_nor_link(
    claims: Path, monkeypatch: pytest.MonkeyPatch, small_bound: int, tmp_path: Path
) -> None:
    planted = claims / "someones-folder"
    (planted / "deep").mkdir(parents=True)
    (planted / "deep" / "kept").write_text("theirs")
    plant(claims, small_bound)
    _flood_gone(claims)
    assert len(_status.snapshots(clean=True)[0].rebuilt) == 1
    assert (planted / "deep" / "kept").read_text() == "theirs"  # where its owner put it
    (old,) = [p for p in claims.parent.iterdir() if p.name.startswith(_compact.OLD_PREFIX)]
    outside = tmp_path / "outside"
    outside.write_text("not gc's")
    (old / "a-link").symlink_to(outside)
    (old / "a-late-folder").mkdir()
    (old / "a-late-folder" / "inside").write_text("x")
    monkeypatch.setattr(_compact, "STALE_S", 0.0)
    snap = _status.snapshots(clean=True)[0]
    # One level, no link followed: the link went, its target did not; a folder planted in the
    # old folder after the rebuild is not entered, so that folder stays (and is not reported).
    assert outside.read_text() == "not gc's" and not (old / "a-link").is_symlink()
    assert (old / "a-late-folder" / "inside").exists()
    assert not any("left by an earlier rebuild" in line for line in snap.removed)


def test_a_rebuild_carries_a_record_its_holder_is_rewriting_in_place(
    claims: Path, small_bound: int
) -> None:
    # Empty at the rebuild's moment, its lock held: left behind, it would be lost to every count.
    record = claims / _records.new_record_name()
    record.write_bytes(b"")
    fd = os.open(record, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        plant(claims, small_bound)
        _flood_gone(claims)
        snap = _status.snapshots(clean=True)[0]
        assert len(snap.rebuilt) == 1 and "1 record(s)" in snap.rebuilt[0], snap.rebuilt
        assert os.stat(record).st_ino == os.fstat(fd).st_ino  # the same file, its lock held
        assert _status.snapshots(clean=True)[0].unknown == [str(record)]
    finally:
        os.close(fd)


def test_a_rebuild_that_cannot_be_done_whole_changes_nothing(
    claims: Path, monkeypatch: pytest.MonkeyPatch, children: list[Child], small_bound: int
) -> None:
    holder = Child(["8GiB", "--name", "held"])
    children.append(holder)
    holder.expect("admitted")
    plant(claims, small_bound)
    _flood_gone(claims)
    before = os.stat(claims).st_ino
    # A filesystem that cannot exchange two folders; then a record that cannot be linked.
    real_exchange, real_link = _compact._renameat2, os.link
    monkeypatch.setattr(_compact, "_renameat2", lambda: lambda *args: -1)
    assert _status.snapshots(clean=True)[0].rebuilt == []
    monkeypatch.setattr(_compact, "_renameat2", real_exchange)

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", refused)
    assert _status.snapshots(clean=True)[0].rebuilt == []
    monkeypatch.setattr(os, "link", real_link)
    assert os.stat(claims).st_ino == before
    assert not any(p.name.startswith(_compact.OLD_PREFIX) for p in claims.parent.iterdir())
    assert [c.name for c in ledger().snapshot().claims] == ["held"]


def test_a_waiter_watching_a_folder_that_is_exchanged_watches_the_new_one(
    tmp_path: Path,
) -> None:
    claims, fresh = tmp_path / "claims", tmp_path / "fresh"
    claims.mkdir()
    fresh.mkdir()
    (fresh / "held.json").write_text("x")
    waker = Waker([claims])
    if waker._file is None or _compact._renameat2() is None:
        pytest.skip("no inotify or no renameat2 here")
    try:
        exchange = _compact._renameat2()
        assert exchange is not None
        assert exchange(-100, str(fresh).encode(), -100, str(claims).encode(), 2) == 0
        assert waker.sleep(5.0) is True  # moved: look again
        (claims / "held.json").unlink()  # a release in the new folder
        assert waker.sleep(5.0, lambda folder, name: name == "held.json") is True
        (fresh / "x.json").write_text("x")
        (fresh / "x.json").unlink()  # the old folder's events are not the claims' any more
        assert waker.sleep(0.2) is False
    finally:
        waker.close()


def test_every_folder_moved_in_one_batch_is_watched_anew(tmp_path: Path) -> None:
    """One gc rebuilds the claims folders of several devices a waiter waits on."""
    exchange = _compact._renameat2()
    pairs = [(tmp_path / f"claims{i}", tmp_path / f"fresh{i}") for i in range(2)]
    for claims, fresh in pairs:
        claims.mkdir()
        fresh.mkdir()
        (fresh / "held.json").write_text("x")
    waker = Waker([claims for claims, _ in pairs])
    if waker._file is None or exchange is None:
        pytest.skip("no inotify or no renameat2 here")
    try:
        for claims, fresh in pairs:
            assert exchange(-100, str(fresh).encode(), -100, str(claims).encode(), 2) == 0
        assert waker.sleep(5.0) is True  # both moves read in one batch
        for claims, _ in pairs:
            (claims / "held.json").unlink()  # a release in each new folder wakes it
            assert waker.sleep(5.0, lambda folder, name: name == "held.json") is True
    finally:
        waker.close()
