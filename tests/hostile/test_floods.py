"""Floods one user can make without privilege (docs/ledger.md, "Set-ups"): files in the shared
folders, flocks on the host. No limit becomes a switch another user can flip: claims go on,
root's gc clears the files, and liveness never reads the host's lock table per scan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memgov
from memgov import _flock, _status
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
        from memgov import _records

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
