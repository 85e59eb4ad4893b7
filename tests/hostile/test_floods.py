"""Floods one user can make without privilege (docs/ledger.md, "Set-ups"): files in the shared
folders, flocks on the host. No limit becomes a switch another user can flip: claims go on,
root's gc clears the files, and liveness never reads the host's lock table per scan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memgov
from memgov import _status
from memgov._files import flock as _flock
from tests.helpers.procs import Child

from .conftest import ACTOR, User

GIB = 2**30
CLAIM = (
    "import memgov\ntry:\n with memgov.claim('{size}'): out('admitted')\n"
    "except memgov.MemgovError as e: out(str(e))"
)


def plant(user: User, folder: Path, count: int, prefix: str = "") -> None:
    """COUNT empty files named like records (so that they must be opened) in FOLDER."""
    user.run(
        "import os\n"
        f"fd = os.open({str(folder)!r}, os.O_RDONLY)\n"
        f"for i in range({count}):\n"
        f" os.close(os.open(f'{prefix}{{i:020d}}-00000000000{{i % 10}}.json', "
        "os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))\nout(1)",
        timeout=600,
    )


def planting(folder: Path, uid: int, count: int, indent: str) -> str:
    """Code lines, indented by INDENT, that plant COUNT empty record-named files owned by UID in
    FOLDER (run as root: it chowns them)."""
    lines = (
        f"fd = os.open({str(folder)!r}, os.O_RDONLY)",
        f"for i in range({count}):",
        " name = f'{i:020d}-00000000000{i % 10}.json'",
        " os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))",
        f" os.chown(name, {uid}, {uid}, dir_fd=fd)",
        "os.close(fd)",
    )
    return "".join(f"{indent}{line}\n" for line in lines)


def gc_with_a_flood_after(step: str, when: str, flood: str) -> str:
    """Code that makes DeviceLedger.STEP run FLOOD (planting code indented by two) after it,
    where WHEN holds, then runs root's gc, leaving its view in ``snap``."""
    return (
        "import os\nfrom memgov import _status; from memgov._ledger import ledger as _ledger\n"
        f"real = _ledger.DeviceLedger.{step}\n"
        "def then_flood(self, *args, **kwargs):\n"
        " got = real(self, *args, **kwargs)\n"
        f" if {when}:\n" + flood + " return got\n"
        f"_ledger.DeviceLedger.{step} = then_flood\n"
        "snap = _status.snapshots(clean=True, set_up=True)[0]\n"
    )


def as_root(code: str) -> Any:
    """CODE run in a new interpreter as root (as `sudo memgov gc` runs); what it last gave out()."""
    done = subprocess.run(
        [sys.executable, "-c", "import json\nout = lambda o: print(json.dumps(o))\n" + code],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def memgov_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgov", *args], capture_output=True, text=True, timeout=600
    )


def test_a_flood_of_files_in_claims_stops_no_one_and_roots_gc_clears_it(
    users: dict[str, User], shared: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    claims = shared / "v1" / "sim0" / "claims"
    holder = Child(["8GiB", "--name", "a's job", "--user", str(a.uid)])
    try:
        holder.expect("admitted")
        plant(b, claims, 100_001)
        assert a.run(CLAIM.format(size="56GiB"), timeout=300) == "admitted"
        assert a.run(CLAIM.format(size="57GiB"), timeout=300).startswith("cannot claim")
        status = a.run(
            "from memgov import _status\nout(_status.status()['devices'][0]['claims'][0]['name'])",
            timeout=300,
        )
        assert status == "a's job"
        gc = memgov_cli("gc", "--json")
        assert gc.returncode == 0, gc.stderr
        assert len(json.loads(gc.stdout)["removed"]) == 100_001
        assert [c.name for c in _status.snapshots()[0].claims] == ["a's job"]
        assert len(os.listdir(claims)) == 1
    finally:
        holder.close()


def test_a_flood_of_dead_cpu_records_is_cleared_by_roots_gc(
    users: dict[str, User], shared: Path
) -> None:
    b = users["mgl_b"]
    cpu = shared / "v1" / "cpu"
    plant(b, cpu, 300_000)
    got = users["mgl_a"].run(
        "import memgov\nwith memgov.claim('1GiB') as c: out(c.reports.get('threads'))",
        timeout=600,
    )
    assert got and f"{os.cpu_count()} governed" not in got
    gc = memgov_cli("gc", "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["cpu_removed"] == 300_000
    assert os.listdir(cpu) == []


def test_a_flood_of_flocks_is_never_read_by_a_scan(
    users: dict[str, User], shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20,000 flocks of another user's own files: /proc/locks grows; liveness must not read it.
    b = users["mgl_b"]
    own = shared.parent / "b-locks"
    own.mkdir()
    os.chown(own, b.uid, b.uid)
    code = (
        "import os, fcntl, sys, resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))\nfds = []\n"
        f"for i in range(10000):\n fd = os.open(os.path.join({str(own)!r}, "
        "f'{os.getpid()}-{i}'), os.O_CREAT | os.O_RDWR, 0o600)\n"
        " fcntl.flock(fd, fcntl.LOCK_EX); fds.append(fd)\n"
        "print('{}', flush=True)\nsys.stdin.readline()\n"
    )
    flooders = [
        subprocess.Popen(
            [sys.executable, str(ACTOR), str(b.uid), code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    holder = Child(["8GiB", "--name", "held", "--user", str(users["mgl_a"].uid)])
    try:
        for proc in flooders:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "{}"
        holder.expect("admitted")
        reads: list[int] = []
        real = _flock.lock_table

        def counted() -> dict[str, list[int]] | None:
            reads.append(1)
            return real()

        monkeypatch.setattr(_flock, "lock_table", counted)
        from memgov._ledger import records as _records

        monkeypatch.setattr(_records, "lock_table", _flock.lock_table)
        snap = _status.snapshots(clean=True)[0]
        with memgov.claim("56GiB"):
            pass
        with pytest.raises(memgov.BudgetExceeded):
            memgov.claim("57GiB")
        assert [c.name for c in snap.claims] == ["held"] and reads == []
    finally:
        holder.close()
        for proc in flooders:
            proc.communicate("\n", timeout=60)


def test_another_users_unfinished_write_costs_no_read_of_the_lock_table(
    users: dict[str, User], shared: Path
) -> None:
    # A writer's temporary file is 0600 until renamed: another user cannot open it, and it is
    # never a live record whatever its lock, so judging it must not read /proc/locks (which B
    # can make huge: every scan that met a claimer's write, or a killed claimer's leftover,
    # would hold the admission lock for that read).
    claims = shared / "v1" / "sim0" / "claims"
    users["mgl_b"].run(
        f"import os\nfd = os.open({str(claims)!r}, os.O_RDONLY)\n"
        "os.close(os.open('.tmp-00000000000000000001-000000000001.json', "
        "os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))\nout(1)"
    )
    code = (
        "from memgov._files import flock as _flock\n"
        "from memgov._ledger import records as _records\nreads = []\nreal = _records.lock_table\n"
        "def counted():\n reads.append(1)\n return real()\n"
        "_records.lock_table = counted\n"
        "from memgov._gpu.devices import devices\nfrom memgov._ledger.ledger import DeviceLedger\n"
        "import memgov\nsnap = DeviceLedger(devices()[0]).snapshot()\n"
        "with memgov.claim('1GiB'): pass\nout([len(reads), snap.free])"
    )
    reads, free = users["mgl_a"].run(code, timeout=300)
    assert free == 64 * GIB
    assert reads == 0  # one per scan before


LOOKS_UNDER_THE_LOCK = """
from memgov._files import flock as _flock
from memgov._ledger import records as _records
held, looks = [False], [0]
enter, leave = _flock.AdmissionLock.__enter__, _flock.AdmissionLock.__exit__
def entered(self):
    got = enter(self)
    held[0] = True
    return got
def left(self, *exc):
    held[0] = False
    return leave(self, *exc)
_flock.AdmissionLock.__enter__, _flock.AdmissionLock.__exit__ = entered, left
def counted(real):
    def look(folder_fd, name, *args, **kwargs):
        looks[0] += held[0]
        return real(folder_fd, name, *args, **kwargs)
    return look
_records._read = counted(_records._read)
"""
"""Counts the files a process looks at (a stat or an open each) while it holds the admission
lock: ``looks[0]``."""


def test_a_snapshot_judges_another_users_flood_before_the_admission_lock(
    users: dict[str, User], shared: Path
) -> None:
    # Every claimer waits while the lock is held: a view of the device (device="auto", "auto"
    # sizing, pack's planner) must not hold it for one look per file of another user's flood.
    plant(users["mgl_b"], shared / "v1" / "sim0" / "claims", 500)
    code = LOOKS_UNDER_THE_LOCK + (
        "from memgov._gpu.devices import devices\nfrom memgov._ledger.ledger import DeviceLedger\n"
        "snap = DeviceLedger(devices()[0]).snapshot()\nout([looks[0], snap.free])"
    )
    looks, free = users["mgl_a"].run(code, timeout=300)
    assert free == 64 * GIB
    assert looks < 64  # _ledger.LOOK_AHEAD; 500 when judged under the lock


def test_roots_gc_judges_files_planted_during_its_sweep_before_the_admission_lock(
    users: dict[str, User], shared: Path
) -> None:
    # A flood goes on while gc sweeps: what arrived meanwhile is judged and removed before the
    # admission lock, not under it.
    claims = shared / "v1" / "sim0" / "claims"
    b = users["mgl_b"]
    code = (
        LOOKS_UNDER_THE_LOCK
        + gc_with_a_flood_after("scan", "kwargs.get('sweep')", planting(claims, b.uid, 500, "  "))
        + f"out([looks[0], len(snap.removed), len(os.listdir({str(claims)!r}))])"
    )
    looks, removed, left = as_root(code)
    assert removed == 500 and left == 0  # root's gc removed B's files, as always
    assert looks < 64  # _ledger.LOOK_AHEAD; 500 when judged under the lock


REMOVALS_UNDER_THE_LOCK = (
    LOOKS_UNDER_THE_LOCK
    + """
removals = [0]
remove_dead = _records.remove_dead
def counted_removal(folder_fd, seen):
    removals[0] += held[0]
    return remove_dead(folder_fd, seen)
_records.remove_dead = counted_removal
"""
)
"""Counts the files a process removes while it holds the admission lock: ``removals[0]``."""


def test_roots_gc_removes_nothing_under_the_admission_lock(
    users: dict[str, User], shared: Path
) -> None:
    # Files that arrive between gc's look before the lock and the lock are judged under it (a
    # stat each), and removed only once it is released: an unlink in a folder B floods waits
    # behind B's creations, and every claimer would wait behind that (383 ms holds on 16 cores).
    claims = shared / "v1" / "sim0" / "claims"
    b = users["mgl_b"]
    code = (
        REMOVALS_UNDER_THE_LOCK
        + gc_with_a_flood_after("look_ahead", "True", planting(claims, b.uid, 30, "  "))
        + f"out([looks[0], removals[0], len(snap.removed), len(os.listdir({str(claims)!r}))])"
    )
    looks, removals, removed, left = as_root(code)
    assert looks == 30  # judged under the lock: they arrived after the look before it
    assert removed == 30 and left == 0  # and removed, reported, as always
    assert removals == 0  # 30 when removed under the lock


def test_status_judges_another_users_flood_before_the_admission_lock_and_says_so(
    users: dict[str, User], shared: Path
) -> None:
    # `memgov status` removes nothing and keeps no store, yet it must not hold every claimer
    # off while it looks at each file of another user's flood: it looks before the lock.
    plant(users["mgl_b"], shared / "v1" / "sim0" / "claims", 500)
    code = LOOKS_UNDER_THE_LOCK + (
        "from memgov import _status\nsnaps = [_status.snapshots()[0] for _ in range(2)]\n"
        "out([looks[0], [s.free for s in snaps], "
        "[[p for p in s.problems if 'more files' in p] for s in snaps]])"
    )
    looks, free, said = users["mgl_a"].run(code, timeout=300)
    assert free == [64 * GIB] * 2
    assert looks < 64  # 1,000 when judged under the lock
    for lines in said:  # each view says so (`status --watch` takes one after another)
        assert lines and "480 more files no one holds" in lines[0]  # 20 named, the rest counted
