"""Claim latency under churn, clean and with another user's floods beside it.

    sudo python benchmarks/cpu/ledger_churn_floods.py [--seconds 20] [--claimers 16] [--json PATH]

Run as root: the processes drop to uids of their own (no passwd entry is needed). Each phase
runs in a fresh root-made ledger (`memgov gc` as root: the admin set-up) on one simulated
16 GiB device: CLAIMERS processes of uid 54321 claim 1-6 GiB with wait=5, hold 20 ms, release,
50 cycles each, timing every claim(); one is SIGKILLed every --kill-every s (default 40 ms)
and replaced; root's
`memgov gc` loops; a monitor of uid 54324 checks under the admission lock that claims never
exceed the device. The "floods" phase adds, from uid 54322: 100,000 empty record-named files in
claims/ and 300,000 in v1/cpu/ (root's gc clears this backlog once, timed, before the churn),
then during the churn 2,000 more in each every second, and 20,000 flocks held on its own
files. Printed: claim p50/p99 (ms, nearest rank) per phase, their ratio, over-commits, errors
and what was left. No GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CLAIMER, FLOODER, MONITOR = 54321, 54322, 54324
GIB = 2**30


def become(uid: int) -> None:
    # Load what a claim needs as root first: the interpreter's own files may be root's alone.
    import logging  # noqa: F401
    import tempfile

    import filelock

    from memgov import _adapters, _claim, _status, _threads  # noqa: F401

    _adapters.available()
    with tempfile.NamedTemporaryFile() as scratch, filelock.FileLock(scratch.name + ".lock"):
        pass
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def claimer(seed: int) -> None:
    become(CLAIMER)
    import memgov

    rng = random.Random(seed)
    for _ in range(50):
        size = rng.choice(["1GiB", "2GiB", "4GiB", "6GiB"])
        t0 = time.perf_counter_ns()
        try:
            held = memgov.claim(size, wait=5)
        except memgov.BudgetExceeded:
            print(json.dumps({"refused_ns": time.perf_counter_ns() - t0}), flush=True)
            continue
        except Exception as exc:  # reported: the run counts every error
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            return
        print(json.dumps({"claim_ns": time.perf_counter_ns() - t0}), flush=True)
        time.sleep(0.02)
        held.release()


def monitor(seconds: float) -> None:
    become(MONITOR)
    from memgov._devices import devices
    from memgov._ledger import DeviceLedger

    ledger = DeviceLedger(devices()[0])
    samples, over, most = 0, [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with ledger.locked():
            snap = ledger.scan(clean=True)  # removes nothing of others; remembers their dead
        samples += 1
        most = max(most, snap.claimed)
        if snap.claimed > snap.capacity:
            over.append(snap.claimed)
        time.sleep(0.01)
    print(json.dumps({"samples": samples, "over_commits": len(over), "max_claimed": most}))


def flooder(ledger: str) -> None:
    import fcntl
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    become(FLOODER)
    claims = Path(ledger, "v1", "sim0", "claims")
    own = Path(tempfile.mkdtemp(prefix="flocks-"))
    fds = []
    for i in range(min(20_000, hard - 100)):
        fd = os.open(own / str(i), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        fds.append(fd)
    plant(claims, 100_000, "a")
    plant(Path(ledger, "v1", "cpu"), 300_000, "b")
    print("ready", flush=True)
    wave = 0
    while True:  # until killed
        wave += 1
        plant(claims, 2_000, f"w{wave}-")
        plant(Path(ledger, "v1", "cpu"), 2_000, f"w{wave}-")
        time.sleep(1.0)


def plant(folder: Path, count: int, tag: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        for i in range(count):
            name = f"{time.time_ns():020d}-{abs(hash((tag, i))) % 16**12:012x}.json"
            with __import__("contextlib").suppress(FileExistsError):
                os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def nearest(values: list[int], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1] / 1e6


def phase(floods: bool, seconds: float, claimers: int, kill_every: float) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="memgov-churn-", dir="/tmp"))
    base.chmod(0o755)
    ledger = base / "ledger"
    env = {**os.environ, "MEMGOV_DIR": str(ledger), "MEMGOV_DEVICES": "sim0:16GiB"}
    me = [sys.executable, __file__]
    subprocess.run([sys.executable, "-m", "memgov", "gc"], env=env, check=True, capture_output=True)
    flood = None
    first_gc_s = None
    if floods:
        flood = subprocess.Popen(
            [*me, "--flooder", str(ledger)], env=env, stdout=subprocess.PIPE, text=True
        )
        assert flood.stdout is not None and flood.stdout.readline().strip() == "ready"
        # The admin's remedy for the backlog: root's gc once (timed), then the churn starts
        # with the flooder still planting waves and holding its flocks.
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "memgov", "gc"], env=env, check=True, capture_output=True
        )
        first_gc_s = time.monotonic() - started
    done = threading.Event()
    gc_runs = [0]

    def gc_loop() -> None:
        while not done.is_set():
            subprocess.run([sys.executable, "-m", "memgov", "gc"], env=env, capture_output=True)
            gc_runs[0] += 1

    watch = subprocess.Popen(
        [*me, "--monitor", str(seconds)], env=env, stdout=subprocess.PIPE, text=True
    )
    gc_thread = threading.Thread(target=gc_loop, daemon=True)
    gc_thread.start()
    rng = random.Random(12)
    live: list[subprocess.Popen[str]] = []
    finished: list[subprocess.Popen[str]] = []
    kills = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        while len(live) < claimers:
            live.append(
                subprocess.Popen(
                    [*me, "--claimer", str(rng.random())],
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        time.sleep(kill_every)
        victim = rng.choice(live)
        victim.send_signal(signal.SIGKILL)
        kills += 1
        finished.extend(p for p in live if p.poll() is not None or p is victim)
        live = [p for p in live if p.poll() is None and p is not victim]
    for proc in live:
        proc.send_signal(signal.SIGKILL)
    finished.extend(live)
    claim_ns, errors = [], []
    for proc in finished:
        out, _ = proc.communicate()
        for line in out.splitlines():
            event = json.loads(line)
            claim_ns.extend([event["claim_ns"]] if "claim_ns" in event else [])
            errors.extend([event["error"]] if "error" in event else [])
    done.set()
    gc_thread.join()
    watched = json.loads(watch.communicate()[0].strip().splitlines()[-1])
    if flood is not None:
        flood.kill()
        flood.wait()
    from memgov import _status

    os.environ.update(MEMGOV_DIR=str(ledger), MEMGOV_DEVICES="sim0:16GiB")
    snap = _status.snapshots(clean=True)[0]
    result = {
        "floods": floods,
        "seconds": seconds,
        "claimers_at_once": claimers,
        "processes": len(finished),
        "sigkills": kills,
        "gc_runs": gc_runs[0],
        "first_gc_s": first_gc_s,
        "admitted": len(claim_ns),
        "errors": len(errors),
        "error_examples": errors[:3],
        "claim_ms": {
            "p50": nearest(claim_ns, 50),
            "p99": nearest(claim_ns, 99),
            "max": max(claim_ns) / 1e6,
        }
        if claim_ns
        else None,
        "monitor": watched,
        "left_at_end": {"claims": len(snap.claims), "queue": len(snap.queue)},
    }
    subprocess.run(["rm", "-rf", str(base)], check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--claimers", type=int, default=16)
    parser.add_argument(
        "--kill-every",
        type=float,
        default=0.04,
        help="seconds between SIGKILLs (one claimer each time)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--claimer")
    parser.add_argument("--monitor", type=float)
    parser.add_argument("--flooder")
    args = parser.parse_args()
    if args.claimer is not None:
        return claimer(int(float(args.claimer) * 2**31))
    if args.monitor is not None:
        return monitor(args.monitor)
    if args.flooder is not None:
        return flooder(args.flooder)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the processes drop to uids of their own")
    clean = phase(False, args.seconds, args.claimers, args.kill_every)
    flooded = phase(True, args.seconds, args.claimers, args.kill_every)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "kill_every_s": args.kill_every,
        "clean": clean,
        "floods": flooded,
        "p99_ratio": (
            flooded["claim_ms"]["p99"] / clean["claim_ms"]["p99"]
            if clean["claim_ms"] and flooded["claim_ms"]
            else None
        ),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
