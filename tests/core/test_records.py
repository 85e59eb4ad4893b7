"""Ledger files: malformed, foreign, unreadable and symlinked files are reported and skipped, never
followed or deleted; other users' records are never lost or altered."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import memgov
from memgov import _status
from memgov._cpu import share as _cpushare
from memgov._files import flock as _flock
from memgov._ledger import deadnames as _deadnames, records as _records
from memgov._ledger.attribution import pidns_of
from memgov._ledger.ledger import new_record_name, record_payload
from tests.helpers.procs import HELPERS, Child, ledger

UID = os.getuid()
"""This user's uid: records the tests write are this user's (root in CI, anyone else too)."""

GIB = 2**30
NOBODY = 65534
AS_USER = HELPERS / "as_user.py"
pytestmark = pytest.mark.usefixtures("sim")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def record(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "version": 1,
        "id": "abcd",
        "kind": "claim",
        "device": "sim0",
        "bytes": 4 * GIB,
        "name": "planted",
        "pid": 1234,
        "created": time.time(),
    }
    data.update(changes)
    return data


def dumps(**changes: object) -> bytes:
    return json.dumps(record(**changes)).encode()


def _without(key: str) -> bytes:
    data = record()
    del data[key]
    return json.dumps(data).encode()


@pytest.fixture
def claims_dir(private_ledger: Path) -> Path:
    ledger().snapshot()  # creates the folders as memgov does
    return private_ledger / "v1" / "sim0" / "claims"


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    here = os.getcwd()
    os.chdir(path.parent)  # a socket's path is at most 107 bytes: bind the name alone
    try:
        sock.bind(path.name)
    finally:
        os.chdir(here)
    sock.close()


PLANTED: list[tuple[str, Callable[[Path], object], str]] = [
    ("corrupt.json", lambda p: p.write_bytes(b"{not json"), "corrupt JSON"),
    ("binary.json", lambda p: p.write_bytes(b"\xff\xfe\x00garbage"), "corrupt JSON"),
    ("empty.json", lambda p: p.write_bytes(b""), "empty (not a record)"),
    ("array.json", lambda p: p.write_bytes(b"[1, 2]"), "not a JSON object"),
    ("nobytes.json", lambda p: p.write_bytes(_without("bytes")), "field 'bytes' missing"),
    ("strbytes.json", lambda p: p.write_bytes(dumps(bytes="4GiB")), "field 'bytes' missing"),
    ("boolbytes.json", lambda p: p.write_bytes(dumps(bytes=True)), "field 'bytes' missing"),
    ("negbytes.json", lambda p: p.write_bytes(dumps(bytes=-1)), "field 'bytes' out of range"),
    ("deep.json", lambda p: p.write_bytes(b"[" * 30_000 + b"]" * 30_000), "corrupt JSON (nested"),
    (
        "digits.json",
        lambda p: p.write_bytes(dumps().replace(b"1234", b"9" * 5000)),
        "corrupt JSON (a number of 5000 digits",
    ),
    ("hugebytes.json", lambda p: p.write_bytes(dumps(bytes=10**400)), "corrupt JSON"),
    ("hugecreated.json", lambda p: p.write_bytes(dumps(created=10**400)), "corrupt JSON"),
    ("farcreated.json", lambda p: p.write_bytes(dumps(created=1e300)), "field 'created' out of"),
    (
        "nan.json",
        lambda p: p.write_bytes(dumps().replace(b'"pid": 1234', b'"pid": NaN')),
        "corrupt JSON (NaN is not accepted",
    ),
    ("floatpid.json", lambda p: p.write_bytes(dumps(pid=1.5)), "field 'pid' missing"),
    ("nullname.json", lambda p: p.write_bytes(dumps(name=None)), "field 'name' missing"),
    ("v2.json", lambda p: p.write_bytes(dumps(version=2)), "record version 2"),
    ("huge.json", lambda p: p.write_bytes(b" " * 70_000 + dumps()), "too large (70"),
    ("notes.txt", lambda p: p.write_text("my notes"), "not a memgov record (unknown name)"),
    ("dir.json", lambda p: p.mkdir(), "not a regular file"),
    ("fifo.json", lambda p: os.mkfifo(p), "not a regular file"),
    ("sock.json", _socket, "unreadable"),
    ("dangling.json", lambda p: p.symlink_to(p.parent / "nowhere"), "a symlink (not followed)"),
]


@pytest.mark.parametrize(("name", "plant", "problem"), PLANTED, ids=[p[0] for p in PLANTED])
def test_bad_file_is_reported_by_status_and_removed_by_gc(
    claims_dir: Path, name: str, plant: Callable[[Path], object], problem: str
) -> None:
    # Every case gets a real record name (any other name is "not a memgov record" unopened),
    # except the one that tests that.
    path = claims_dir / (name if name == "notes.txt" else new_record_name())
    plant(path)
    before = os.lstat(path)
    snap = _status.snapshots(clean=False)[0]  # what `memgov status` does: reads only
    mine = [p for p in snap.problems if path.name in p]
    assert len(mine) == 1 and mine[0].startswith(f"{path}: {problem}"), snap.problems
    assert snap.claims == [] and snap.removed == []
    after = os.lstat(path)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_size,
    )
    # gc: no one holds the file, so it is no one's live claim: removed (a folder is left).
    swept = _status.snapshots(clean=True)[0]
    if name == "dir.json":
        assert path.is_dir() and any(path.name in p for p in swept.problems)
    else:
        gone = [r for r in swept.removed if path.name in r]
        assert len(gone) == 1 and gone[0].startswith(f"{path} (")
        assert gone[0].endswith(f", uid {UID})")
        assert not os.path.lexists(path)
    with memgov.claim("64GiB") as whole:  # the bad file held no budget
        assert whole.bytes == 64 * GIB


def test_symlinked_record_is_not_followed_and_its_target_untouched(
    claims_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target.json"
    content = dumps()
    target.write_bytes(content)  # a valid record: followed, it would count 4 GiB
    link = claims_dir / new_record_name()
    os.symlink(target, link)
    stamp = os.stat(target)
    snap = _status.snapshots(clean=False)[0]
    assert snap.claims == [] and snap.removed == []
    assert any(f"{link.name}: a symlink (not followed)" in p for p in snap.problems)
    assert os.stat(target).st_mtime_ns == stamp.st_mtime_ns
    assert target.read_bytes() == content
    assert os.path.islink(link)
    ledger().snapshot()  # an admission's scan removes the link itself, never its target
    assert not os.path.lexists(link) and target.read_bytes() == content


def _hold_lock(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_locked_corrupt_record_blocks_and_foreign_device_record_is_skipped(
    claims_dir: Path,
) -> None:
    # A live (locked) record whose size cannot be read may be anyone's claim: it must block
    # admissions (fail closed), not vanish from the count.
    corrupt = claims_dir / new_record_name()
    corrupt.write_bytes(b"{oops")
    foreign = claims_dir / new_record_name()
    foreign.write_bytes(dumps(device="sim9"))
    fds = [_hold_lock(corrupt), _hold_lock(foreign)]
    try:
        snap = _status.snapshots(clean=True)[0]
        assert snap.claims == [] and snap.removed == [] and snap.free == 0
        assert snap.unknown == [str(corrupt)]
        assert any(
            f"{corrupt.name}: corrupt JSON" in p and "size is unknown" in p for p in snap.problems
        )
        assert any(f"{foreign.name}: record of device sim9" in p for p in snap.problems)
        with pytest.raises(memgov.BudgetExceeded, match="unknown size block it"):
            memgov.claim("1GiB")
        assert corrupt.exists() and foreign.exists()
    finally:
        for fd in fds:
            os.close(fd)
    with memgov.claim("64GiB"):  # unlocked now: dead, it holds nothing
        pass


def test_a_locked_empty_record_blocks_and_is_never_removed_or_dead_for_good(
    claims_dir: Path,
) -> None:
    # Its holder holds the lock while it rewrites the file in place: one look at the empty file
    # is no proof that no one's claim is there. It blocks (size unknown), and no scan removes
    # it or remembers it as dead; unlocked, it is nobody's, removed and remembered.
    path = claims_dir / new_record_name()
    path.write_bytes(b"")
    fd = _hold_lock(path)
    try:
        for clean in (False, True):
            snap = _status.snapshots(clean=clean)[0]
            assert snap.free == 0 and snap.unknown == [str(path)] and snap.removed == []
        swept = subprocess.run(
            [sys.executable, "-m", "memgov", "gc", "--json"], capture_output=True, text=True
        )
        assert json.loads(swept.stdout)["removed"] == [] and path.exists()
        folder = os.open(claims_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            (seen,) = [s for s in _records.scan(folder, remember=True) if s.name == path.name]
            assert seen.alive and seen.locked and not seen.final
            info = os.fstat(folder)
            assert path.name not in _deadnames.known((info.st_dev, info.st_ino))
        finally:
            os.close(folder)
    finally:
        os.close(fd)
    cleaned = _status.snapshots(clean=True)[0]
    assert cleaned.free == 64 * GIB and not path.exists()


def _start_tick(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[-1].split()[19])


def test_a_holder_is_told_by_its_start_tick_never_by_the_clock() -> None:
    # A live process whose record's time lies an hour before the clock (the clock stepped
    # forward since): alive, by its start tick, by its PID alone where a record has no tick
    # (an older memgov's) or one of another time namespace; another start tick on its PID is
    # a later process's (the PID was reused): dead.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        base = record(pid=child.pid, pidns=pidns_of(), created=time.time() - 3600)
        assert _records.holder_alive(base)
        mine, tick = _records.writer(), _start_tick(child.pid)
        assert _records.holder_alive({**base, "start": tick, "timens": mine["timens"]})
        other_ns = (mine["timens"] or 0) + 1
        assert _records.holder_alive({**base, "start": tick + 1, "timens": other_ns})
        assert not _records.holder_alive({**base, "start": tick + 1, "timens": mine["timens"]})
    finally:
        child.kill()
        child.wait()
    assert not _records.holder_alive(base)  # gone: dead, whatever its record says


def test_a_governed_process_whose_record_predates_a_clock_step_keeps_its_cpu_share(
    private_ledger: Path,
) -> None:
    # Its CPU-share record's time lies an hour before the clock: it is still a governed process
    # that shares the cores (not removed as dead by the others' scans).
    code = (
        "import sys, time\nfrom memgov._cpu import cpus as _cpus\n"
        "from memgov._cpu import share as _cpushare\nreal = time.time\n"
        "time.time = lambda: real() - 3600\n"
        "reg = _cpushare.register(_cpus.usable(), 1, 'test', '')\ntime.time = real\n"
        "print('ready', flush=True)\nsys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert [p.pid for p in _cpushare.peers()] == [child.pid]
    finally:
        child.communicate("\n", timeout=30)


def test_dead_record_counts_nothing_and_gc_removes_it(claims_dir: Path) -> None:
    dead = claims_dir / new_record_name()
    dead.write_bytes(dumps(bytes=60 * GIB))  # its writer died: nobody holds its lock
    read_only = _status.snapshots(clean=False)[0]
    assert read_only.claims == [] and read_only.free == 64 * GIB and dead.exists()
    cleaned = _status.snapshots(clean=True)[0]
    assert cleaned.removed == [f"{dead} (dead holder, uid {UID})"]
    assert not dead.exists()


def test_unfinished_write_is_removed_only_when_old(claims_dir: Path) -> None:
    fresh = claims_dir / ".tmp-fresh.json"
    old = claims_dir / ".tmp-old.json"
    fresh.write_bytes(b"{")
    old.write_bytes(b"{")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    snap = _status.snapshots(clean=True)[0]
    assert snap.removed == [f"{old} (unfinished write of a dead process, uid {UID})"]
    assert snap.problems == []
    assert fresh.exists() and not old.exists()


# -- folders that are symlinks or not folders ------------------------------------------------------


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("untouched")
    yield target
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "untouched"


@pytest.mark.parametrize("where", ["v1", "v1/sim0", "v1/sim0/claims", "v1/sim0/queue"])
def test_symlinked_ledger_folder_is_refused(
    private_ledger: Path, elsewhere: Path, where: str
) -> None:
    link = private_ledger / where
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, link)
    with pytest.raises(memgov.LedgerError, match="is a symlink or not a folder"):
        memgov.claim("1GiB", wait=0.1 if where.endswith("queue") else None)
    assert memgov.current() is None


def test_symlinked_memgov_dir_is_refused(
    tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.symlink(elsewhere, tmp_path / "link")
    monkeypatch.setenv("MEMGOV_DIR", str(tmp_path / "link"))
    with pytest.raises(memgov.LedgerError, match="memgov never follows symlinks"):
        memgov.claim("1GiB")


def test_symlinked_admission_lock_is_refused(claims_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("do not truncate")
    lock = claims_dir.parent / "admission.lock"
    lock.unlink()
    os.symlink(target, lock)
    with pytest.raises(memgov.LedgerError, match="cannot lock"):
        memgov.claim("1GiB")
    assert target.read_text() == "do not truncate"
    assert oct(os.stat(target).st_mode & 0o777) == "0o644"


def test_memgov_dir_that_is_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("MEMGOV_DIR", str(tmp_path / "file"))
    with pytest.raises(memgov.LedgerError, match="not a folder"):
        memgov.claim("1GiB")


@needs_root  # a user who is not root makes a private ledger (0755 claims/): docs/ledger.md
def test_folders_are_shared_and_records_readable(private_ledger: Path) -> None:
    with memgov.claim("1GiB") as held:
        device = private_ledger / "v1" / "sim0"
        for folder in (private_ledger, private_ledger / "v1", device):
            assert os.stat(folder).st_mode & 0o7777 == 0o755, folder  # root's: nobody plants
        for folder in (device / "claims", device / "queue"):
            assert os.stat(folder).st_mode & 0o7777 == 0o1777, folder
        assert os.stat(device / "claims" / held.record).st_mode & 0o777 == 0o644
        assert os.stat(device / "admission.lock").st_mode & 0o777 == 0o644


# -- other users ---------------------------------------------------------------------------------


def as_nobody(*action: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, str(AS_USER), str(NOBODY), *action],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def _fingerprint(path: Path) -> tuple[object, ...]:
    info = os.stat(path)
    return (
        info.st_ino,
        info.st_uid,
        info.st_mode,
        info.st_size,
        info.st_mtime_ns,
        path.read_bytes(),
    )


@needs_root
def test_another_users_claim_is_never_removed_or_altered(shared_ledger: Path) -> None:
    ledger().snapshot()  # the admin set-up: root creates the folders (docs/ledger.md)
    other = Child(["8GiB", "--name", "nobody's", "--user", str(NOBODY)])
    try:
        got = other.expect("admitted")
        path = shared_ledger / "v1" / "sim0" / "claims" / got["record"]
        assert os.stat(path).st_uid == NOBODY
        before = _fingerprint(path)
        with pytest.raises(memgov.BudgetExceeded, match=r"nobody's 8\.00 GiB"):
            memgov.claim("57GiB")
        snap = _status.snapshots(clean=True)[0]  # root's gc
        assert snap.removed == [] and [c.name for c in snap.claims] == ["nobody's"]
        assert snap.claims[0].uid == NOBODY
        with memgov.claim("56GiB"):
            pass
        assert _fingerprint(path) == before
        other.release()
        other.expect("released")
        assert not path.exists()  # it removed its own record on release
    finally:
        other.close()


@needs_root
def test_another_user_cannot_remove_roots_records(shared_ledger: Path) -> None:
    with memgov.claim("8GiB", name="root's") as held:
        claims = shared_ledger / "v1" / "sim0" / "claims"
        live = claims / held.record
        dead = claims / new_record_name()
        dead.write_bytes(dumps(bytes=GIB))  # root's dead holder: unlocked
        os.chmod(dead, 0o644)
        before = _fingerprint(live)
        seen = as_nobody("gc")
        assert seen["removed"] == [] and seen["claimed"] == 8 * GIB
        assert seen["problems"] == [f"{dead}: dead holder (uid 0); {_records.NOT_MINE}"]
        # The sticky bit protects root's record even from a direct unlink.
        assert as_nobody("unlink", str(live)) == {"error": "PermissionError"}
        assert _fingerprint(live) == before and dead.exists()
    assert _status.snapshots(clean=True)[0].removed == [f"{dead} (dead holder, uid 0)"]


@needs_root
def test_unreadable_record_is_reported_to_a_user_who_cannot_read_it(shared_ledger: Path) -> None:
    ledger().snapshot()
    secret = shared_ledger / "v1" / "sim0" / "claims" / new_record_name()
    secret.write_bytes(dumps())
    os.chmod(secret, 0o600)
    problems = as_nobody("gc")["problems"]
    assert problems == [
        f"{secret}: unreadable (Permission denied), not locked (uid 0); {_records.NOT_MINE}"
    ]
    assert secret.exists()


@needs_root
def test_ledger_folder_without_write_permission_is_a_clear_error(
    shared_ledger: Path,
) -> None:
    shared_ledger.mkdir(mode=0o755)
    os.chmod(shared_ledger, 0o755)  # root's, not shared: nobody cannot create the device folder
    answer = as_nobody("claim", "1GiB")
    assert answer["error"] == "LedgerError"
    assert "only root creates folders there" in str(answer["message"])
    assert "sudo memgov gc" in str(answer["message"])


def test_record_replaced_after_it_was_read_dead_is_not_removed(claims_dir: Path) -> None:
    # A scanner opened the old copy of a record, the holder renamed an updated copy over it and
    # closed the old one (now unlocked): the scanner must not unlink the live, updated record.
    book = ledger()
    payload = record_payload("claim", book.device, GIB, "updating", "soft")
    held = book.add("claims", payload)
    try:
        old = os.stat(claims_dir / held.name)
        book.update("claims", held, {**payload, "mode": "hard"})
        stale = _records.Seen(held.name, False, None, None, 0, (old.st_dev, old.st_ino))
        fd = os.open(claims_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert _records.remove_dead(fd, stale) == _records.GONE
        finally:
            os.close(fd)
        assert [c.mode for c in book.snapshot().claims] == ["hard"]
    finally:
        book.remove("claims", held)
    assert book.snapshot().claims == []


@contextlib.contextmanager
def _interrupt_after_rename() -> Iterator[pytest.MonkeyPatch]:
    """Within: os.replace in memgov's records renames, then raises as Ctrl-C would as it
    returns (the tests' own environment, set by their fixtures, stays as it is)."""
    real = os.replace

    def rename_then_interrupt(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_records.os, "replace", rename_then_interrupt)
        yield patch


def _locked_by_someone(path: Path) -> bool:
    """Whether another open of ``path`` cannot take its lock (flock locks belong to each
    open file, so this process's own held record counts as someone's)."""
    with open(path, "rb") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


@pytest.fixture
def folder_fd(claims_dir: Path) -> Iterator[int]:
    """The claims folder, open as memgov's records code takes it."""
    fd = os.open(claims_dir, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


@pytest.fixture
def held(claims_dir: Path, folder_fd: int) -> Iterator[_records.Held]:
    """A record this process holds (its name field "planted"), released at the end."""
    mine = _records.create(folder_fd, claims_dir, new_record_name(), record(pid=os.getpid()))
    yield mine
    _records.release(folder_fd, mine)


def _holds(held: _records.Held, says: str) -> None:
    """The visible record says ``says``, is the file ``held`` holds, and is locked: alive."""
    assert json.loads(held.path.read_bytes())["name"] == says
    assert os.fstat(held.file.fileno()).st_ino == held.path.stat().st_ino
    assert not held.file.closed and _locked_by_someone(held.path)


def test_an_interrupt_right_after_an_updates_rename_still_swaps_the_held_file(
    folder_fd: int, held: _records.Held
) -> None:
    with _interrupt_after_rename(), pytest.raises(KeyboardInterrupt):
        _records.replace(folder_fd, held, record(pid=os.getpid(), name="updated"))
    _holds(held, "updated")  # the new record, and the process holds it: alive to readers
    assert [p.name for p in held.folder.iterdir()] == [held.name]  # no temporary file left


def test_an_interrupt_right_after_a_new_records_rename_leaves_no_record(
    claims_dir: Path, folder_fd: int
) -> None:
    with _interrupt_after_rename(), pytest.raises(KeyboardInterrupt):
        _records.create(folder_fd, claims_dir, new_record_name(), record(pid=os.getpid()))
    assert list(claims_dir.iterdir()) == []  # its creator never held it: nothing to count


def test_a_second_interrupt_in_the_clean_up_still_leaves_the_holder_the_visible_file(
    folder_fd: int, held: _records.Held
) -> None:
    real_stat = os.stat
    landed: list[str] = []

    def interrupted_once(*args: object, **kwargs: object) -> os.stat_result:
        if not landed:  # the clean-up's first look: a second Ctrl-C lands there
            landed.append("second")
            raise KeyboardInterrupt
        return real_stat(*args, **kwargs)  # type: ignore[arg-type]

    with _interrupt_after_rename() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(_records.os, "stat", interrupted_once)
        _records.replace(folder_fd, held, record(pid=os.getpid(), name="updated"))
    assert landed == ["second"]
    _holds(held, "updated")


def test_a_share_record_update_cut_short_after_its_rename_keeps_what_it_wrote(
    private_ledger: Path,
) -> None:
    from memgov._cpu import cpus as _cpus, share as _cpushare

    registration = _cpushare.register(_cpus.usable(), 2, "test", "holder")
    try:
        with _interrupt_after_rename(), pytest.raises(KeyboardInterrupt):
            registration.update(threads=1, source="user")
        # What the record says is what the process remembers: the next update builds on it.
        assert registration.payload["source"] == "user"
        registration.update(why="later")
        on_disk = json.loads(registration.held.path.read_bytes())
        assert (on_disk["threads"], on_disk["source"], on_disk["why"]) == (1, "user", "later")
    finally:
        registration.close()


def test_a_shrink_cut_short_after_its_rename_keeps_the_size_it_wrote(
    private_ledger: Path,
) -> None:
    claim = memgov.claim("2GiB")
    try:
        with _interrupt_after_rename(), pytest.raises(KeyboardInterrupt):
            claim.shrink(GIB)
        assert claim.bytes == GIB  # what its record says now, not the 2 GiB it had
        snap = _status.snapshots(clean=False)[0]
        assert snap.free == 63 * GIB  # the record is alive, counting the 1 GiB it says
    finally:
        claim.release()


def test_an_update_whose_temporary_file_a_scan_removed_fails_and_keeps_the_record(
    folder_fd: int, held: _records.Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer stopped for a minute between its write and its rename finds its temporary file
    # removed by a scan (they go once a minute old): the update fails, the record it held stays.
    kept, real = held.file, os.replace

    def removed_first(src: str, dst: str, **kwargs: int) -> None:
        os.unlink(src, dir_fd=kwargs["src_dir_fd"])
        real(src, dst, **kwargs)

    monkeypatch.setattr(_records.os, "replace", removed_first)
    with pytest.raises(memgov.LedgerError, match="cannot write"):
        _records.replace(folder_fd, held, record(pid=os.getpid(), name="updated"))
    monkeypatch.setattr(_records.os, "replace", real)
    assert held.file is kept
    _holds(held, "planted")


def test_an_interrupt_before_the_rename_leaves_the_holder_its_old_file(
    folder_fd: int, held: _records.Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The holder takes the new file just before the rename; an interrupt that lands there
    # (before os.replace ran) must give it back its old file, still the visible record.
    kept = held.file

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(_records.os, "replace", interrupted)
        _records.replace(folder_fd, held, record(pid=os.getpid(), name="updated"))
    assert held.file is kept
    _holds(held, "planted")
    assert [p.name for p in held.folder.iterdir()] == [held.name]  # the temporary file gone


def test_a_temporary_file_left_by_an_interrupted_write_blocks_no_later_update(
    folder_fd: int, held: _records.Held
) -> None:
    real = _records.open_owned
    left: list[io.FileIO] = []

    def opened_then_interrupted(*args: Any, **kwargs: Any) -> io.FileIO:
        left.append(real(*args, **kwargs))  # the file exists; memgov never gets it
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(_records, "open_owned", opened_then_interrupted)
        _records.replace(folder_fd, held, record(pid=os.getpid(), name="first"))
    left[0].close()
    # The old fixed name planted and locked by someone else blocks nothing either.
    with open(held.folder / f"{_flock.TMP_PREFIX}{held.name}", "wb") as planted:
        fcntl.flock(planted, fcntl.LOCK_EX)
        _records.replace(folder_fd, held, record(pid=os.getpid(), name="second"))
    _holds(held, "second")
