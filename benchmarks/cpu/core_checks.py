"""The core ledger's checks (results/HISTORY.md, "Core ledger"): a script with a table and JSON.

    python benchmarks/cpu/core_checks.py [--repeat 10] [--hold 0.5] [--json PATH]

1a. 20 processes each claim 4 GiB of a simulated 64 GiB GPU with wait=None and hold: counts of
    admitted and refused, and the most claimed that a monitor ever saw. The monitor samples the
    ledger under the admission lock the whole time and counts every over-commit.
1b. The same 20 with wait=30, each holding --hold seconds: how many finished, when each was
    admitted, and whether admissions followed queue (arrival) order.
2.  A holder of the whole GPU is SIGKILLed: seconds from kill() until a claim of the whole GPU
    succeeds (polled in this process), --repeat times; in the host PID namespace and with the
    holder as init of its own PID namespace (unshare --pid --fork --mount-proc; needs root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench.py
from bench import down, ended, report_head

GIB = 2**30
SIZE = 4 * GIB


def worker(size: str, wait: float | None, hold: str, name: str) -> None:
    import memgov
    from memgov import _claim  # noqa: F401  (loaded before the barrier, not timed)

    print(json.dumps({"event": "ready"}), flush=True)
    sys.stdin.readline()  # the barrier: every claimer starts at the same moment
    try:
        held = memgov.claim(size, wait=wait, name=name)
    except memgov.BudgetExceeded as exc:
        print(json.dumps({"event": "refused", "t": time.time(), "message": str(exc)}), flush=True)
        return
    print(json.dumps({"event": "admitted", "t": time.time(), "record": held.record}), flush=True)
    if hold == "stdin":
        sys.stdin.readline()
    elif hold == "forever":
        while True:
            time.sleep(3600)
    else:
        time.sleep(float(hold))
    held.release()
    print(json.dumps({"event": "released", "t": time.time()}), flush=True)


def spawn(args: list[str], prefix: list[str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*(prefix or []), sys.executable, __file__, "--worker", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    if event(proc)["event"] != "ready":
        raise SystemExit(f"worker {proc.pid} did not start")
    return proc


def say(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def go(procs: list[subprocess.Popen[str]]) -> float:
    start = time.time()
    for proc in procs:
        say(proc, "go")
    return start


def event(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"worker {proc.pid} ended without reporting (exit {proc.wait()})")
    result: dict[str, Any] = json.loads(line)
    return result


class Monitor(threading.Thread):
    """Samples the ledger under its admission lock; records over-commits and queue order."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        from memgov._gpu.devices import devices
        from memgov._ledger.ledger import DeviceLedger

        self.ledger = DeviceLedger(devices()[0])
        self.samples = 0
        self.max_claimed = 0
        self.max_claims = 0
        self.max_queue = 0
        self.over_commits = 0
        self.tickets: dict[str, str] = {}  # claimer name -> its queue record (arrival order)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            with self.ledger.locked():
                snap = self.ledger.scan(clean=False)
            self.samples += 1
            self.max_claimed = max(self.max_claimed, snap.claimed)
            self.max_claims = max(self.max_claims, len(snap.claims))
            self.max_queue = max(self.max_queue, len(snap.queue))
            self.over_commits += snap.claimed + snap.outside > snap.capacity
            for waiter in snap.queue:
                self.tickets.setdefault(waiter.name, waiter.record)
            time.sleep(0.002)

    def stop(self) -> None:
        self.done.set()
        self.join()


def check_no_wait() -> dict[str, Any]:
    monitor = Monitor()
    monitor.start()
    procs = [spawn(["4GiB", "none", "stdin", f"c{i:02d}"]) for i in range(20)]
    go(procs)
    outcomes = [event(p)["event"] for p in procs]
    time.sleep(0.2)  # let the monitor sample the full ledger
    for proc, outcome in zip(procs, outcomes, strict=True):
        if outcome == "admitted":  # the refused ones have exited
            say(proc, "release")
    for proc in procs:
        proc.wait(timeout=60)
    monitor.stop()
    return {
        "claimers": 20,
        "size_gib": 4,
        "device_gib": 64,
        "admitted": outcomes.count("admitted"),
        "refused": outcomes.count("refused"),
        "monitor_samples": monitor.samples,
        "max_claimed_gib": monitor.max_claimed / GIB,
        "over_commits_seen": monitor.over_commits,
    }


def check_wait(hold: float) -> dict[str, Any]:
    monitor = Monitor()
    monitor.start()
    procs = [spawn(["4GiB", "30", str(hold), f"w{i:02d}"]) for i in range(20)]
    start = go(procs)
    admitted = [event(p) for p in procs]
    released = [event(p) for p in procs]
    finished = sum(p.wait(timeout=60) == 0 for p in procs)
    monitor.stop()
    admitted_names = [f"w{i:02d}" for i in range(20)]
    order = sorted(range(20), key=lambda i: admitted[i]["record"])  # admission order
    queued = [i for i in order if admitted_names[i] in monitor.tickets]
    arrival = sorted(queued, key=lambda i: monitor.tickets[admitted_names[i]])
    return {
        "claimers": 20,
        "size_gib": 4,
        "device_gib": 64,
        "hold_s": hold,
        "wait_s": 30,
        "finished": finished,
        "admitted_s": sorted(round(a["t"] - start, 3) for a in admitted),
        "released_s": sorted(round(r["t"] - start, 3) for r in released),
        # Admitted only after some holder had released: they waited their turn.
        "admitted_after_a_release": sum(a["t"] > min(r["t"] for r in released) for a in admitted),
        "queued_seen_by_monitor": len(queued),
        "admitted_in_arrival_order": [admitted_names[i] for i in queued]
        == [admitted_names[i] for i in arrival],
        "max_held_at_once": monitor.max_claims,
        "max_queue": monitor.max_queue,
        "monitor_samples": monitor.samples,
        "max_claimed_gib": monitor.max_claimed / GIB,
        "over_commits_seen": monitor.over_commits,
    }


def sigkill_once(prefix: list[str] | None) -> dict[str, float]:
    import memgov

    holder = spawn(["64GiB", "none", "forever", "victim"], prefix)
    go([holder])
    event(holder)
    victim = holder.pid
    if prefix:  # unshare forks the namespace's init: that is the holder to kill
        victim = int(Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()[0])
    t0 = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    tries = 0
    while True:
        tries += 1
        try:
            memgov.claim("64GiB").release()
            break
        except memgov.BudgetExceeded:
            if time.perf_counter() - t0 > 10:
                raise SystemExit("budget not free 10 s after SIGKILL") from None
    seconds = time.perf_counter() - t0
    holder.wait(timeout=10)
    return {"seconds": seconds, "tries": tries}


def check_sigkill(repeat: int, pidns: bool) -> dict[str, Any]:
    if pidns and os.geteuid() != 0:
        return {"skipped": "needs root for unshare --pid"}
    if pidns and shutil.which("unshare") is None:
        return {"skipped": "util-linux unshare is not installed"}
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"] if pidns else None
    runs = [sigkill_once(prefix) for _ in range(repeat)]
    seconds = [r["seconds"] for r in runs]
    return {
        "repeat": repeat,
        "seconds": seconds,
        "min_s": min(seconds),
        "median_s": statistics.median(seconds),
        "max_s": max(seconds),
        "tries": [r["tries"] for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="SIGKILL measurements per mode")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each waiter holds (1b)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        size, wait, hold, name = args.worker
        worker(size, None if wait == "none" else float(wait), hold, name)
        return
    with tempfile.TemporaryDirectory(prefix="memgov-checks-") as tmp:
        os.environ.update(MEMGOV_DIR=str(Path(tmp) / "ledger"), MEMGOV_DEVICES="sim0:64GiB")
        os.environ.pop("MEMGOV_HOLDER", None)
        report: dict[str, Any] = {
            **report_head("core_checks", euid=os.geteuid()),
            "no_wait": check_no_wait(),
            "wait": check_wait(args.hold),
            "sigkill_host_pidns": check_sigkill(args.repeat, pidns=False),
            "sigkill_own_pidns": check_sigkill(args.repeat, pidns=True),
        }
        ended(report)
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def print_table(report: dict[str, Any]) -> None:
    a, b = report["no_wait"], report["wait"]
    print("check                                   result")
    print(
        f"1a 20 x 4 GiB on 64 GiB, wait=None       admitted {a['admitted']}, refused "
        f"{a['refused']}, max claimed seen {a['max_claimed_gib']:g} GiB, over-commits "
        f"{a['over_commits_seen']} in {a['monitor_samples']} samples"
    )
    print(
        f"1b same, wait=30, hold {b['hold_s']:g} s            finished {b['finished']}/20, "
        f"at most {b['max_held_at_once']} held at once, {b['admitted_after_a_release']} admitted "
        f"only after a release, "
        f"FIFO {b['admitted_in_arrival_order']}, over-commits {b['over_commits_seen']} in "
        f"{b['monitor_samples']} samples, last admitted at {b['admitted_s'][-1]} s"
    )
    for key, label in (("sigkill_host_pidns", "host PID ns"), ("sigkill_own_pidns", "own PID ns")):
        k = report[key]
        if "skipped" in k:
            print(f"2  SIGKILL -> claimable ({label})      skipped: {k['skipped']}")
        else:
            print(
                f"2  SIGKILL -> claimable ({label:11})  median {down(k['median_s'] * 1e3)} ms, "
                f"max {down(k['max_s'] * 1e3)} ms over {k['repeat']} kills"
            )


if __name__ == "__main__":
    main()
