"""Names known dead for good (memgov/_ledger/deadnames.py): a flood costs a new process of a user
whose processes already judged it a listing, not a look at each file; no verdict that may change is
kept; no name another user shapes can make a live record's name look dead."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memgov._files import flock as _flock
from memgov._ledger import deadnames as _deadnames, records as _records
from memgov._ledger.ledger import record_payload
from tests.helpers.procs import ledger

GIB = 2**30
pytestmark = pytest.mark.usefixtures("sim")

SCAN = """
import json, os, sys
from memgov._ledger import deadnames as _deadnames
from memgov._files import flock as _flock
from memgov._ledger import records as _records
looks = {"stat": 0, "open": 0}
real_stat, real_open = os.stat, os.open
def stat(*a, **k):
    looks["stat"] += 1
    return real_stat(*a, **k)
def open_(*a, **k):
    looks["open"] += 1
    return real_open(*a, **k)
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
os.stat, os.open = stat, open_
seen = _records.scan(fd, remember=True)
os.stat, os.open = real_stat, real_open
_deadnames.flush()
print(json.dumps({**looks, "alive": sorted(s.name for s in seen if s.alive)}))
"""
"""A new process's scan of a folder: its file looks (stat, open), the live records it found."""


def scan_in_new_process(folder: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", SCAN, str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def plant(folder: Path, count: int, content: bytes = b"") -> None:
    for i in range(count):
        (folder / f"{i:020d}-{i % 4096:012x}.json").write_bytes(content)


def scanned(fd: int, name: str) -> Any:
    """What a remembering scan of the folder ``fd`` finds of the file ``name``."""
    return {s.name: s for s in _records.scan(fd, remember=True)}[name]


def remembered(fd: int, name: str) -> bool:
    """Whether ``name`` is among the folder ``fd``'s names known dead for good."""
    info = os.fstat(fd)
    return name in _deadnames.known((info.st_dev, info.st_ino))


@pytest.fixture
def claims_dir(private_ledger: Path) -> Path:
    ledger().snapshot()  # creates the folders as memgov does
    return private_ledger / "v1" / "sim0" / "claims"


def test_a_new_process_looks_at_no_file_its_users_processes_found_dead(claims_dir: Path) -> None:
    # 600 empty files and 200 unlocked records under record names (a flood the scanning user
    # cannot remove, as another user's in a sticky folder: the scan itself removes nothing).
    plant(claims_dir, 600)
    for i in range(200):
        name = f"{10**19 + i:020d}-{i:012x}.json"
        (claims_dir / name).write_text(
            json.dumps(record_payload("claim", ledger().device, GIB, "x", "soft"))
        )
    book = ledger()
    held = book.add("claims", record_payload("claim", book.device, GIB, "live", "soft"))
    try:
        first = scan_in_new_process(claims_dir)
        second = scan_in_new_process(claims_dir)
        assert first["alive"] == second["alive"] == [held.name]
        assert first["stat"] >= 800  # the first process judged each file
        # The next one reads its user's store of dead names: a few looks (the store, its
        # folders, the live record), not one per file.
        assert second["stat"] + second["open"] < 60, second
    finally:
        book.remove("claims", held)


def test_an_update_seen_mid_way_is_not_dead_for_good(
    claims_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The holder renames an updated copy over its record between a scanner's open and its lock
    # probe: the old copy is unlocked by then. That verdict must not outlive the scan, or the
    # live record would be skipped by name from then on.
    book = ledger()
    payload = record_payload("claim", book.device, GIB, "updating", "soft")
    held = book.add("claims", payload)
    real_probe = _records._open_probe

    def probe_then_update(folder_fd: int, name: str) -> io.FileIO:
        probe = real_probe(folder_fd, name)
        if name == held.name:
            book.update("claims", held, {**payload, "mode": "hard"})
        return probe

    fd = os.open(claims_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        monkeypatch.setattr(_records, "_open_probe", probe_then_update)
        raced = scanned(fd, held.name)
        monkeypatch.setattr(_records, "_open_probe", real_probe)
        assert not raced.alive and not raced.final
        assert not remembered(fd, held.name)
        again = scanned(fd, held.name)
        assert again.alive and again.data is not None and again.data["mode"] == "hard"
    finally:
        os.close(fd)
        book.remove("claims", held)


def test_names_another_user_shapes_never_make_a_live_record_look_dead(claims_dir: Path) -> None:
    # Dead files whose names hold a live record's name on a line of its own: the store keeps
    # one name a line, so such a name must never be written there.
    book = ledger()
    held = book.add("claims", record_payload("claim", book.device, GIB, "live", "soft"))
    try:
        for shaped in (f"x\n{held.name}", f"{held.name}\n", f"{held.name}\nx"):
            (claims_dir / shaped).write_bytes(b"")
        plant(claims_dir, 100)  # enough to be worth storing
        assert scan_in_new_process(claims_dir)["alive"] == [held.name]
        assert scan_in_new_process(claims_dir)["alive"] == [held.name]
        stores = list(claims_dir.parents[2].glob(f"v1/_profiles/*/{_deadnames.PREFIX}*"))
        assert stores and all(held.name not in s.read_text().split("\n") for s in stores)
    finally:
        book.remove("claims", held)


def test_a_locked_record_whose_holder_only_looks_gone_is_never_dead_for_good(
    claims_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A locked record whose holder looks gone (a child forked from C keeps a dead parent's
    # lock): dead for this scan; never remembered, since its lock still says someone holds it.
    book = ledger()
    held = book.add("claims", record_payload("claim", book.device, GIB, "stepped", "soft"))
    fd = os.open(claims_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(_records, "holder_alive", lambda data: False)
            seen = scanned(fd, held.name)
        assert not seen.alive and not seen.final
        assert not remembered(fd, held.name)
        assert scanned(fd, held.name).alive
    finally:
        os.close(fd)
        book.remove("claims", held)


def test_names_a_scan_cannot_judge_for_good_do_not_reload_the_store_every_scan(
    claims_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hung writer's temporary files stay locked: never dead for good, never a live record. Seen
    # once, they are not new: scans under the admission lock must not read the store for them.
    import fcntl

    held = []
    for i in range(_deadnames.RELOAD_AT + 10):
        path = claims_dir / f"{_flock.TMP_PREFIX}hung-{i}"
        handle = path.open("w")
        fcntl.flock(handle, fcntl.LOCK_EX)
        held.append(handle)
    reloads: list[object] = []
    real_reload = _deadnames.reload

    def counted(key: tuple[int, int], root: Path | None = None) -> None:
        reloads.append(key)
        real_reload(key, root)

    monkeypatch.setattr(_deadnames, "reload", counted)
    fd = os.open(claims_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(5):
            _records.scan(fd, remember=True)
        assert len(reloads) <= 1
        assert _records.unjudged(fd) == 0
    finally:
        os.close(fd)
        for handle in held:
            handle.close()
            os.unlink(handle.name)


def _names(first: int, count: int) -> set[str]:
    return {f"{first + i:020d}-{i:012x}.json" for i in range(count)}


def _store_file(key: tuple[int, int]) -> Path:

    with _flock.private_folder(create=True) as (_fd, path):
        return path / _deadnames._file(key)


def test_the_store_is_a_log_read_from_where_each_process_left_it(private_ledger: Path) -> None:
    """One process's verdicts reach the others at once and for the bytes appended: a reader
    reads only what was appended since its last read, whole lines only."""
    key = (1, 2)
    early, late = _names(10**19, 10), _names(2 * 10**19, 10)
    _deadnames.learn(key, early, early)
    _deadnames.flush()
    store = _store_file(key)
    assert set(store.read_text().split()) == early
    _deadnames.forget()  # another process: reads the whole log once
    assert _deadnames.known(key) == early
    # Text changed in place before its offset is not read again (only appends are) ...
    with open(store, "r+b") as file:
        file.write(b"9" * 20)
    # ... and an append seen half-way counts only once its line is whole.
    half = sorted(late)[0]
    with open(store, "ab") as file:
        file.write(half[:10].encode())
    _deadnames.reload(key)
    assert _deadnames.known(key) == early
    with open(store, "ab") as file:
        file.write((half[10:] + "\n").encode())
    _deadnames.reload(key)
    assert _deadnames.known(key) == early | {half}
    # Rewritten by another process (a new, here empty, file): read from its top from then on.
    store.unlink()
    store.write_bytes(b"")
    _deadnames.reload(key)
    again = sorted(late)[1]
    with open(store, "ab") as file:
        file.write((again + "\n").encode())
    _deadnames.reload(key)
    assert again in _deadnames.known(key)


def test_a_log_grown_past_the_folder_is_rewritten_with_the_names_still_there(
    private_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_deadnames, "COMPACT_BYTES", 1024)
    key = (3, 4)
    for wave in range(10):  # waves of another user's files, each removed before the next
        names = _names((wave + 1) * 10**18, 20)
        _deadnames.learn(key, names, names)
        _deadnames.flush()
    store = _store_file(key)
    size = store.stat().st_size
    # Rewritten on the way: not ten waves of names.
    assert size < 4 * 20 * _deadnames.LINE_BYTES + 1024
    last = _names(10 * 10**18, 20)
    _deadnames.forget()
    assert last <= _deadnames.known(key)  # the latest names survive a rewrite


def test_names_are_stored_in_the_ledger_they_were_learned_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background scan (an earlier claim's thread) flushing after MEMGOV_DIR changed keeps what
    it learned in its own ledger's store and makes nothing in the new one: a folder made there by
    root would lock every user out of that ledger."""
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("MEMGOV_DIR", str(first))
    _deadnames.forget()
    key = (0, 424242)
    names = _names(7, 3)
    _deadnames.learn(key, names, names, root=first)
    monkeypatch.setenv("MEMGOV_DIR", str(second))
    _deadnames.flush()
    assert not second.exists()
    monkeypatch.setenv("MEMGOV_DIR", str(first))
    assert set(_store_file(key).read_text().split()) == names
    _deadnames.forget()
