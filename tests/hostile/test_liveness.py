"""Who holds what, told right (docs/ledger.md, "Liveness"): a process whose main thread ended
keeps its claim, a record names the user who owns its file (not whom its text names), planted
records shrink no one's CPU share, and their text reaches no terminal; a lock held too long is
blamed on the process that holds it."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import memgov
from memgov import _status
from memgov._base.errors import LockTimeout
from memgov._gpu.devices import devices
from memgov._ledger.attribution import pidns_of
from memgov._ledger.ledger import DeviceLedger, new_record_name
from tests.helpers.procs import Child, wait_until

from .conftest import ACTOR, User, start

GIB = 2**30


def test_a_holder_whose_main_thread_ended_keeps_its_claim(
    users: dict[str, User], shared: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    # The main thread claims, starts a thread that lives on, and ends alone (SYS_exit, not
    # exit_group): the thread-group leader is a zombie while the process and its lock live.
    holder = start(
        a,
        "import ctypes, threading, time, memgov, sys\n"
        "memgov.claim('48GiB', name='a-main-gone')\n"
        "threading.Thread(target=time.sleep, args=(300,)).start()\n"
        "print('{}', flush=True)\n"
        "ctypes.CDLL(None).syscall(60, 0)\n",
    )
    try:
        wait_until(
            lambda: (
                Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            ),
            timeout=10,
        )
        got = b.run(
            "import memgov\ntry:\n memgov.claim('32GiB'); out('ADMITTED')\n"
            "except memgov.BudgetExceeded as e: out(e.free)"
        )
        assert got == 16 * GIB
        gc = subprocess.run(
            [sys.executable, "-m", "memgov", "gc", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(gc.stdout)["removed"] == []
        assert [c.name for c in _status.snapshots()[0].claims] == ["a-main-gone"]
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_c_forked_child_holding_the_admission_lock_is_named(shared: Path) -> None:
    code = (
        "import ctypes, os, sys, time\nfrom memgov._gpu.devices import devices\n"
        "from memgov._ledger.ledger import DeviceLedger\n"
        "lock = DeviceLedger(devices()[0]).locked(1).__enter__()\n"
        "pid = ctypes.CDLL(None).fork()\n"
        "if pid == 0:\n time.sleep(300); os._exit(0)\n"
        "print(pid, flush=True)\ntime.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(timeout=30)
        with pytest.raises(LockTimeout) as caught, DeviceLedger(devices()[0]).locked(0.5):
            pass
        assert f"by pid {child}, which inherited it from pid {parent.pid} (gone)" in str(
            caught.value
        )
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_lock_held_from_outside_the_claimers_pid_namespace_says_so(
    users: dict[str, User], shared: Path
) -> None:
    holder = start(
        users["mgl_b"],
        "import time\nfrom memgov._gpu.devices import devices\n"
        "from memgov._ledger.ledger import DeviceLedger\n"
        "lock = DeviceLedger(devices()[0]).locked(1).__enter__()\n"
        "print('{}', flush=True)\ntime.sleep(300)\n",
    )
    try:
        inner = (
            "from memgov._base.errors import LockTimeout\nfrom memgov._gpu.devices import devices\n"
            "from memgov._ledger.ledger import DeviceLedger\ntry:\n"
            " with DeviceLedger(devices()[0]).locked(timeout=0.5): print('got it')\n"
            "except LockTimeout as e: print(e)\n"
        )
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", inner],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "outside this PID namespace" in done.stdout, done.stdout + done.stderr
        assert "lsof" in done.stdout
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_planted_record_is_shown_with_its_owner_not_the_user_it_names(
    users: dict[str, User], shared: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    victim = Child(["8GiB", "--name", "train-alice", "--user", str(a.uid)])
    try:
        pid = victim.expect("admitted")["pid"]
        path = shared / "v1" / "sim0" / "claims" / new_record_name()
        record = {
            "version": 1,
            "id": "ab",
            "kind": "claim",
            "device": "sim0",
            "bytes": 48 * GIB,
            "name": "train-alice",
            "pid": pid,
            "pidns": pidns_of(),
            "host": os.uname().nodename,
            "created": time.time(),
            "mode": "soft",
        }
        planter = start(
            b,
            f"import fcntl, json, os\nfd = os.open({str(path)!r}, "
            "os.O_CREAT | os.O_RDWR, 0o644)\n"
            f"os.write(fd, json.dumps({record!r}).encode())\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('{}', flush=True)\n"
            "import sys; sys.stdin.readline()\n",
        )
        try:
            got = a.run(
                "import memgov\ntry:\n memgov.claim('16GiB')\n"
                "except memgov.BudgetExceeded as e: out(str(e))"
            )
            assert f"train-alice 48.00 GiB (uid {b.uid})" in got, got
            claims = _status.status()["devices"][0]["claims"]
            assert sorted((c["name"], c["uid"]) for c in claims) == [
                ("train-alice", a.uid),
                ("train-alice", b.uid),
            ]
            table = subprocess.run(
                [sys.executable, "-m", "memgov", "status"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            assert str(b.uid) in table
        finally:
            planter.communicate("\n", timeout=30)
    finally:
        victim.close()


def test_planted_cpu_records_shrink_no_ones_share_and_reach_no_terminal(
    users: dict[str, User], shared: Path
) -> None:
    b = users["mgl_b"]
    cpu = shared / "v1" / "cpu"
    cores = len(os.sched_getaffinity(0))
    evil = "\x1b]0;owned\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"
    # 21 locked records naming processes that are not b's (pid 1, and root's own pid), and one
    # real governed process of b whose record carries terminal sequences in every text field.
    code = (
        "import fcntl, json, os, time, sys\nfds = []\n"
        "for i in range(21):\n"
        f" path = os.path.join({str(cpu)!r}, f'{{time.time_ns():020d}}-{{i:012x}}.json')\n"
        " fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)\n"
        f" data = dict(version=1, kind='cpu', pid=[1, {os.getpid()}][i % 2], "
        f"pidns={pidns_of()}, host='h', created=time.time(), cpus=list(range(64)), "
        "quota_key=None, threads=1, source='x', holder='', why='')\n"
        " os.write(fd, json.dumps(data).encode()); fcntl.flock(fd, fcntl.LOCK_EX)\n"
        " fds.append(fd)\n"
        "from memgov._cpu import cpus as _cpus; from memgov._cpu import share as _cpushare\n"
        f"reg = _cpushare.register(_cpus.usable(), 1, {evil!r}, {evil!r}, {evil!r})\n"
        "print('{}', flush=True)\nsys.stdin.readline()\n"
    )
    planter = start(b, code)
    try:
        # The claimer is a fresh process: this test process's CPU-share and dead-file memories
        # come from earlier tests' ledgers (another MEMGOV_DIR), and once made the claim count
        # one governed process instead of two when run after tests/auto's claims.
        claimer = subprocess.run(
            [
                sys.executable,
                "-c",
                "import memgov\nwith memgov.claim('1GiB') as held:\n"
                " print(held.reports.get('threads', ''))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        report = claimer.stdout
        assert f"{cores} usable core(s) / 2 governed process(es)" in report, claimer
        doctor = subprocess.run(
            [sys.executable, "-m", "memgov", "doctor"], capture_output=True, text=True, timeout=60
        )
        assert "\\x1b]0;owned" in doctor.stdout, doctor.stdout
        assert "\x1b" not in doctor.stdout and "\x07" not in doctor.stdout
    finally:
        planter.communicate("\n", timeout=30)


def test_pid_reuse_after_a_c_fork_frees_the_claim(shared: Path) -> None:
    # The parent claims and forks from C, then dies; the child holds the lock. The record's
    # PID is the parent's: gone, so the claim is free, without reading /proc/locks.
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "forker.py"), "c-fork"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    child = json.loads(proc.stdout.readline())["child"]
    try:
        assert _status.snapshots()[0].claimed == 8 * GIB
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: _status.snapshots()[0].claimed == 0, timeout=5)
        assert os.path.exists(f"/proc/{child}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def _gc() -> dict[str, Any]:
    """Root's `memgov gc --json`."""
    done = subprocess.run(
        [sys.executable, "-m", "memgov", "gc", "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got: dict[str, Any] = json.loads(done.stdout)
    return got


TRY_48 = (
    "import memgov\ntry:\n with memgov.claim('48GiB'): out('ADMITTED')\n"
    "except memgov.BudgetExceeded as e: out(e.free)"
)
"""A's claim of 48 GiB beside B's live 48 GiB on 64: never admitted; the free budget it saw."""


def test_a_live_record_rewritten_in_place_is_never_dead_for_good(
    users: dict[str, User], shared: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    claims = shared / "v1" / "sim0" / "claims"
    # B's claim lives, its lock held throughout, while B truncates its record and writes it
    # back in place (a writer that does not rename): A looks during the empty moment.
    holder = start(
        b,
        "import os, sys, memgov\nmemgov.claim('48GiB', name='b-in-place')\n"
        f"path = os.path.join({str(claims)!r}, os.listdir({str(claims)!r})[0])\n"
        "data = open(path, 'rb').read()\nprint('{}', flush=True)\n"
        "sys.stdin.readline()\nfd = os.open(path, os.O_WRONLY | os.O_TRUNC)\n"
        "print('empty', flush=True)\nsys.stdin.readline()\nos.write(fd, data)\nos.close(fd)\n"
        "print('back', flush=True)\nsys.stdin.readline()\n",
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        (record,) = os.listdir(claims)
        assert a.run(TRY_48) == 16 * GIB  # A's store of dead names exists before the moment
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "empty"
        assert a.run(TRY_48) == 0  # a live record of unknown size: nothing is free
        assert _gc()["removed"] == [] and (claims / record).exists()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "back"
        for _ in range(3):  # every later process of A's counts B's claim again
            assert a.run(TRY_48) == 16 * GIB
        assert _gc()["removed"] == []
        assert [c.name for c in _status.snapshots()[0].claims] == ["b-in-place"]
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.parametrize("step", [10, 3600], ids=["10s", "1h"])
def test_a_forward_step_of_the_wall_clock_frees_no_live_claim(
    users: dict[str, User], shared: Path, step: int
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    claims = shared / "v1" / "sim0" / "claims"
    # What a clock stepped forward by STEP after B's claim looks like: the record's time lies
    # STEP before the clock, and the boot time /proc/stat gives has moved as far (the start
    # time computed from it lies after the record's creation).
    holder = start(
        b,
        "import sys, time, memgov\nreal = time.time\n"
        f"time.time = lambda: real() - {step}\n"
        "memgov.claim('48GiB', name='b-stepped')\ntime.time = real\n"
        "print('{}', flush=True)\nsys.stdin.readline()\n",
    )
    try:
        (record,) = os.listdir(claims)
        created = json.loads((claims / record).read_text())["created"]
        assert created < time.time() - step + 1
        assert a.run(TRY_48) == 16 * GIB
        assert _gc()["removed"] == [] and (claims / record).exists()
        assert a.run(TRY_48) == 16 * GIB
        assert [c.name for c in _status.snapshots()[0].claims] == ["b-stepped"]
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_holder_in_a_time_namespace_of_its_own_keeps_its_claim(
    users: dict[str, User], shared: Path
) -> None:
    a, b = users["mgl_a"], users["mgl_b"]
    # A time namespace with its own boot time shows every process's start shifted by it: the
    # start B records of itself is not what A reads of B's PID, so A may not take it as B's.
    code = "import sys, memgov\nmemgov.claim('48GiB', name='b-timens')\n"
    code += "print('{}', flush=True)\nsys.stdin.readline()\n"
    argv = ["unshare", "--time", "--boottime", "1000", "--fork"]
    holder = subprocess.Popen(
        [*argv, sys.executable, str(ACTOR), str(b.uid), code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "{}":
        holder.wait(timeout=30)
        pytest.skip("no time namespaces here (unshare --time failed)")
    try:
        assert a.run(TRY_48) == 16 * GIB
        assert _gc()["removed"] == []
        assert [c.name for c in _status.snapshots()[0].claims] == ["b-timens"]
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_gc_never_removes_a_record_whose_lock_is_held(users: dict[str, User], shared: Path) -> None:
    # A parent claims, forks from C and dies: its child holds the lock of a record naming a
    # dead process. Dead for the budget; but no gc, root's or its owner's, removes the file
    # while the lock is held (it goes once the lock does).
    claims = shared / "v1" / "sim0" / "claims"
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "forker.py"), "c-fork"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    child = json.loads(proc.stdout.readline())["child"]
    try:
        (record,) = os.listdir(claims)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: _status.snapshots()[0].claimed == 0, timeout=5)
        gc = _gc()
        assert gc["removed"] == [] and (claims / record).exists()
        assert any(record in p and "holds its lock" in p for p in gc["skipped"]), gc
        with memgov.claim("64GiB"):  # the budget is free; the scan under the lock keeps it
            pass
        assert (claims / record).exists()
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: not os.path.exists(f"/proc/{child}"), timeout=10)
        assert any(record in r for r in _gc()["removed"])
    finally:
        with contextlib.suppress(ProcessLookupError):  # the child was killed above
            os.killpg(proc.pid, signal.SIGKILL)


_ = ctypes  # the tests above drive ctypes in their children
