"""Every governed process gets its share of the CPU, with real processes.

The observed process is a real interpreter that imports torch under auto-enable and answers
"what is torch's thread count on your main thread?" on request; its neighbours are real governed
processes (memgov.claim() without a framework: cheap to start). Shares on this machine's cores;
the arithmetic for larger machines is checked on the share function itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memgov._cpu import share as _cpushare
from memgov._cpu.cpus import Quota, Usable

CORES = len(os.sched_getaffinity(0))
HALF = max(1, CORES // 2)

OBSERVER = """
import json, os, sys
import torch
print("ready", torch.get_num_threads(), flush=True)
for line in sys.stdin:
    command = line.split()
    if command and command[0] == "set":
        torch.set_num_threads(int(command[1]))
    for _ in range(2000):  # bytecode for the interpreter's pending calls to run in
        pass
    print(json.dumps({"torch": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
                      "interop": torch.get_num_interop_threads()}), flush=True)
"""

NEIGHBOUR = """
import sys, memgov
memgov.claim("1GiB")
print("ready", flush=True)
sys.stdin.read()
"""


class Proc:
    def __init__(self, code: str, env: dict[str, str], prefix: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-c", code],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if not first.startswith("ready"):
            self.proc.kill()
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"did not start: {first!r} {stderr[-3000:]}")
        self.first = first.split()

    def ask(self, command: str = "") -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stderr(self) -> str:
        self.stop()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=60)


@contextlib.contextmanager
def running(code: str, env: dict[str, str], prefix: list[str] | None = None) -> Iterator[Proc]:
    proc = Proc(code, env, prefix)
    try:
        yield proc
    finally:
        proc.stop(signal.SIGKILL)


def eventually(probe: Callable[[], Any], want: Callable[[Any], bool], limit: float = 60) -> Any:
    """Ask until the answer is what is wanted (the share is followed about once a second); the
    limit only keeps a broken build from hanging the suite."""
    deadline = time.monotonic() + limit
    while True:
        seen = probe()
        if want(seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.2)


def governed(env: dict[str, str], **extra: str) -> dict[str, str]:
    return {**env, "MEMGOV_CLAIM": "1GiB", **extra}


def records(env: dict[str, str]) -> list[dict[str, Any]]:
    folder = Path(env["MEMGOV_DIR"]) / "v1" / "cpu"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


# -- alone, neighbours, following ---------------------------------------------------------------
def test_alone_gets_all_usable_cores(env: dict[str, str]) -> None:
    # Eventually: on a host busy with something else it starts lower and grows as cores go idle
    # (test_a_start_on_a_busy_host_waits_for_idle_cores).
    with running(OBSERVER, governed(env)) as alone:
        seen = eventually(alone.ask, lambda s: s["torch"] == CORES)
        assert seen["torch"] == CORES and seen["omp"] == str(CORES)
    assert f"(share: {CORES} core(s) in the affinity mask" in alone.stderr()


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores to narrow the affinity mask")
def test_affinity_mask_is_the_usable_cores(env: dict[str, str]) -> None:
    with running(OBSERVER, governed(env), prefix=["taskset", "-c", "0"]) as pinned:
        assert pinned.ask()["torch"] == 1


@pytest.mark.skipif(CORES < 2, reason="a share below all cores needs 2 cores")
def test_neighbours_take_their_share_and_give_it_back(env: dict[str, str]) -> None:
    """Alone: all cores. A governed neighbour arrives: the share, applied to torch's main thread
    while it runs. The neighbour is killed: all cores again."""
    with running(OBSERVER, governed(env)) as observed:
        assert eventually(observed.ask, lambda s: s["torch"] == CORES)["torch"] == CORES
        neighbour = Proc(NEIGHBOUR, governed(env))
        try:
            seen = eventually(observed.ask, lambda s: s["torch"] == HALF)
            assert seen["torch"] == HALF and seen["omp"] == str(HALF)
            mine = [r for r in records(env) if r["pid"] == observed.proc.pid]
            assert mine and mine[0]["threads"] == HALF and mine[0]["source"] == "auto"
        finally:
            neighbour.stop(signal.SIGKILL)  # however it ends, its record stops counting
        assert eventually(observed.ask, lambda s: s["torch"] == CORES)["torch"] == CORES
    assert "followed as governed processes come and go" in observed.stderr()


def test_a_late_arrival_starts_with_its_share(env: dict[str, str]) -> None:
    with running(NEIGHBOUR, governed(env)), running(OBSERVER, governed(env)) as late:
        assert late.ask()["torch"] == HALF
        assert int(late.first[1]) == HALF  # already at import torch, before any user code


BUSY = "while True:\n    pass\n"
PATIENT_OBSERVER = OBSERVER.replace(
    "import torch\n",
    "from memgov._cpu import threads as _threads\n_threads.GROW_WITHIN_S = 120.0\nimport torch\n",
    1,
)
"""OBSERVER whose share waits for idle cores 120 s at most (not 10): on a loaded host its
import of torch alone can take most of 10 s, and then the share would grow while the test
still expects it to wait."""


@contextlib.contextmanager
def busy_cores() -> Iterator[list[subprocess.Popen[bytes]]]:
    """One busy loop per usable core (work memgov does not govern), running when this yields."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(CORES)]
    try:
        time.sleep(0.5)  # running, not starting
        yield busy
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(CORES < 2, reason="a share below all cores needs 2 cores")
def test_a_start_on_a_busy_host_waits_for_idle_cores(env: dict[str, str]) -> None:
    """Jobs launched together register one by one while all of them are busy starting: a
    process alone among the records but on a host whose cores all run something starts at 1
    thread (it started at all cores, the OpenMP workers spinning against the others), stays
    there while the cores stay busy, and grows to all cores once they go idle."""
    with busy_cores() as busy, running(PATIENT_OBSERVER, governed(env)) as observed:
        assert int(observed.first[1]) == 1
        time.sleep(2.5)  # two rounds of following: the cores stayed busy
        assert observed.ask()["torch"] == 1
        for proc in busy:
            proc.kill()
        assert eventually(observed.ask, lambda s: s["torch"] == CORES)["torch"] == CORES
    assert "runnable elsewhere on the host now: 1 to start with" in observed.stderr()


BARE = """
import json, sys, memgov
from memgov._cpu import threads as _threads
memgov.claim("1GiB")
print("ready", _threads.current().threads, flush=True)
for line in sys.stdin:
    print(json.dumps({"threads": _threads.current().threads}), flush=True)
"""


HELD = BARE.replace('memgov.claim("1GiB")', '_threads.GROW_WITHIN_S = 3.0\nmemgov.claim("1GiB")')
"""BARE, its share held back by busy cores for at most 3 s."""


@pytest.mark.skipif(CORES < 2, reason="a share below all cores needs 2 cores")
def test_busy_cores_hold_a_share_back_for_a_while_not_for_good(env: dict[str, str]) -> None:
    """Cores that never go idle (work memgov does not govern) keep a new process below its
    share only for GROW_WITHIN_S (3 s here): then it takes its share anyway."""
    with busy_cores() as busy, running(HELD, governed(env)) as held:
        assert int(held.first[1]) == 1
        assert eventually(held.ask, lambda s: s["threads"] == CORES)["threads"] == CORES
        assert all(proc.poll() is None for proc in busy)  # still busy all along


@pytest.mark.skipif(CORES < 2, reason="a share below all cores needs 2 cores")
def test_a_process_without_a_framework_follows_the_share_too(env: dict[str, str]) -> None:
    """No framework's threads to set on the main thread: the budget is the share itself (it
    stayed at the first share, and the record was rewritten every second, making every
    neighbour read all records again)."""
    with running(BARE, governed(env)) as bare:
        assert eventually(bare.ask, lambda s: s["threads"] == CORES)["threads"] == CORES
        with running(NEIGHBOUR, governed(env)):
            assert eventually(bare.ask, lambda s: s["threads"] == HALF)["threads"] == HALF


COUNTED = """
import json, sys, time, memgov
from memgov._cpu import share as _cpushare
from memgov._cpu import threads as _threads
_threads.FOLLOW_INTERVAL_S, _threads.RESCAN_S = 0.02, 3600.0
counts = {"rounds": 0, "reads": 0}
stamp, peers = _threads._folder_stamp, _cpushare.peers

def counted_stamp(root):
    counts["rounds"] += 1
    return stamp(root)

def counted_peers(*args, **kwargs):
    counts["reads"] += 1
    return peers(*args, **kwargs)

_threads._folder_stamp, _cpushare.peers = counted_stamp, counted_peers
memgov.claim("1GiB")
print("ready", flush=True)
for line in sys.stdin:
    start = counts["rounds"]
    while counts["rounds"] < start + 50:
        time.sleep(0.01)
    print(json.dumps({**counts, "threads": _threads.current().threads}), flush=True)
"""


@pytest.mark.skipif(CORES < 2, reason="a share below all cores needs 2 cores")
def test_the_follower_reads_the_records_only_when_their_folder_changed(
    env: dict[str, str],
) -> None:
    """Fifty rounds of following with nobody arriving or leaving: at most one reading of the
    records (each costs milliseconds of CPU under the interpreter's lock, against the training
    loop); a neighbour arriving is still seen at the next round."""
    with running(COUNTED, governed(env)) as counted:
        before = counted.ask()
        idle = counted.ask()
        assert idle["rounds"] >= before["rounds"] + 50
        assert idle["reads"] - before["reads"] <= 1
        with running(NEIGHBOUR, governed(env)):
            seen = eventually(counted.ask, lambda s: s["threads"] == HALF)
            assert seen["threads"] == HALF and seen["reads"] > idle["reads"]


def peer(name: str, cpus: range, key: str | None = None) -> _cpushare.Peer:
    return _cpushare.Peer(name, 1, "h", frozenset(cpus), key, None, "auto", "")


def test_share_arithmetic_on_larger_machines() -> None:
    sixteen = Usable(frozenset(range(16)), None)
    many = [peer(f"{i:03d}", range(16)) for i in range(25)]
    assert {_cpushare.share(sixteen, many, p.record).threads for p in many} == {1}
    five = many[:5]
    # 16 cores / 5: 3 each, the remainder to the earliest arrival.
    assert [_cpushare.share(sixteen, five, p.record).threads for p in five] == [4, 3, 3, 3, 3]
    # Neighbours pinned to other cores do not count; a process not yet registered is the newest.
    elsewhere = [peer("000", range(16, 32)), peer("001", range(8))]
    assert _cpushare.share(sixteen, elsewhere, None).threads == 8
    assert _cpushare.share(sixteen, [], None).threads == 16
    # A 4-CPU quota shared by 2 processes of the same cgroup, on 16 cores with 3 neighbours.
    quota = Usable(frozenset(range(16)), Quota(4.0, "cpu.max", "cg1"))
    peers = [peer("a", range(16), "cg1"), peer("b", range(16), "cg2"), peer("c", range(16), "cg1")]
    assert _cpushare.share(quota, peers, "a").threads == 2
    assert _cpushare.share(quota, peers, "c").threads == 2
    assert _cpushare.share(quota, peers, "c").quota_neighbours == 2


# -- the user's settings win ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "note"),
    [
        ({"OMP_NUM_THREADS": "1"}, "OMP_NUM_THREADS=1 set by the user"),
        ({"MEMGOV_THREADS": "1"}, "1 CPU thread(s) (MEMGOV_THREADS=1)"),
    ],
)
@pytest.mark.skipif(CORES < 2, reason="the user's 1 must differ from the share")
def test_the_users_variables_win(env: dict[str, str], extra: dict[str, str], note: str) -> None:
    with running(OBSERVER, governed(env, **extra)) as observed:
        assert observed.ask()["torch"] == 1
        with running(NEIGHBOUR, governed(env)):
            time.sleep(2.5)  # two rounds of following: nothing may change
            assert observed.ask()["torch"] == 1
    assert note in observed.stderr()


@pytest.mark.skipif(CORES < 2, reason="the user's 1 must differ from the share")
def test_torch_threads_set_before_an_explicit_claim_are_kept(env: dict[str, str], py) -> None:
    code = (
        "import torch, memgov\ntorch.set_num_threads(1)\nc = memgov.claim('1GiB')\n"
        "print(torch.get_num_threads()); print(c.reports.get('torch'))"
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr
    threads, report = result.stdout.splitlines()[-2:]
    assert threads == "1" and "set before the claim: kept" in report


@pytest.mark.skipif(CORES < 2, reason="a share below all cores needs 2 cores")
def test_torch_threads_set_after_the_claim_stop_the_following(env: dict[str, str]) -> None:
    with running(OBSERVER, governed(env)) as observed:
        assert observed.ask("set 1")["torch"] == 1  # the user's own choice, after the claim
        neighbour = Proc(NEIGHBOUR, governed(env))

        def mine() -> dict[str, Any]:
            observed.ask()  # the main thread runs: the follower's pending call with it
            return next(r for r in records(env) if r["pid"] == observed.proc.pid)

        assert eventually(mine, lambda r: r["source"] == "user")["threads"] == 1
        neighbour.stop(signal.SIGKILL)
        time.sleep(2.5)  # two rounds of following: the share is back at all cores, not applied
        assert observed.ask()["torch"] == 1


def test_off_leaves_threads_alone(env: dict[str, str]) -> None:
    off = governed(env, MEMGOV_THREADS="off")
    with running(NEIGHBOUR, governed(env)), running(OBSERVER, off) as observed:
        seen = observed.ask()
        assert seen["torch"] == CORES and seen["omp"] is None
        assert all(r["pid"] != observed.proc.pid for r in records(env))
    assert "CPU thread(s)" not in observed.stderr()


def test_garbage_is_a_warning_in_auto_mode_and_an_error_in_strict_mode(env, py) -> None:
    code = "import torch; print(torch.get_num_threads())"
    warned = py(code, governed(env, MEMGOV_THREADS="lots"))
    assert warned.returncode == 0
    assert "MEMGOV_THREADS='lots': accepted auto" in warned.stderr
    assert "continuing without a memgov budget" in warned.stderr
    strict = py(code, governed(env, MEMGOV_THREADS="lots", MEMGOV_STRICT="1"))
    assert strict.returncode != 0
    assert "ConfigError: MEMGOV_THREADS='lots': accepted auto" in strict.stderr


def test_the_record_stays_in_the_ledger_it_was_made_in(env: dict[str, str], tmp_path: Path, py):
    """A process that points MEMGOV_DIR elsewhere after its claim (a test suite does) neither
    moves its record nor counts the other folder's processes."""
    other = tmp_path / "other"
    code = (
        # Its full share after 0.5 s even on a busy machine (idle cores or not): the count of
        # governed processes is what this test looks at.
        "import os, time, memgov\nfrom memgov._cpu import threads as _threads\n"
        "_threads.GROW_WITHIN_S = 0.5\n"
        "memgov.claim('1GiB')\n"
        f"os.environ['MEMGOV_DIR'] = {str(other)!r}\n"
        "time.sleep(2.5)\n"  # two rounds of following, then a late follower's round waited for
        "deadline = time.monotonic() + 60\n"
        f"while _threads.current().threads != {CORES} and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
        "print(_threads.current().threads)"
    )
    with running(NEIGHBOUR, {**governed(env), "MEMGOV_DIR": str(other)}):
        result = py(code, env)
        in_other = list((other / "v1" / "cpu").glob("*.json"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == str(CORES)  # alone in its own ledger
    assert len(in_other) == 1  # the neighbour's only: the record did not move there


def test_a_governed_process_can_end_its_threads_without_memory(env: dict[str, str], py) -> None:
    """glibc loads libgcc_s at a process's first pthread_exit (a daemon thread waking while the
    interpreter finalizes): with the address space used up (a tight RLIMIT_AS, a job ending in
    MemoryError) that load fails and the process aborts. memgov loads it before its threads run."""
    code = (
        "import memgov\nmemgov.claim('1GiB')\nprint('libgcc_s' in open('/proc/self/maps').read())"
    )
    result = py(code, governed(env))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "True"
