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
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
from bench import summed_profiles

CLAIMER, FLOODER, MONITOR = 54321, 54322, 54324
PROFILE_ENV = "CHURN_PROFILE_DIR"
BREAKDOWN_ENV = "CHURN_BREAKDOWN"
"""--breakdown: each claimer times the parts of its claims (Breakdown) and prints them."""
"""--profile: the folder each claimer writes its cProfile of its claim() calls to."""
GIB = 2**30


def become(uid: int) -> None:
    # Load what a claim needs as root first: the interpreter's own files may be root's alone.
    import logging  # noqa: F401
    import tempfile

    import filelock

    from memgov import _adapters, _claim, _status  # noqa: F401
    from memgov._cpu import threads as _threads  # noqa: F401

    _adapters.available()
    # In the run's folder (removed at its end): a claimer SIGKILLed here leaves nothing behind.
    run = Path(os.environ["MEMGOV_DIR"]).parent
    with tempfile.TemporaryDirectory(dir=run) as scratch, filelock.FileLock(f"{scratch}/x.lock"):
        pass
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


class Breakdown:
    """--breakdown: where each claim's time went, by wrapping memgov's steps in this process
    (seconds and calls per step, reset per claim). Steps: the look before the admission lock
    (first_look), the looks under it (look: NVML, lock wait and the scan; lock_wait: the wait
    alone), a waiter's checks of its place in the queue (place) and its sleeps (sleep; wakes:
    those a wanted removal ended), joining and leaving the queue, the thread share of the first
    claim (govern), the run record (runs), the store of dead names (flush, reload); head_s: from
    the first moment this waiter was first in the queue to the end of the claim."""

    def __init__(self) -> None:
        self.parts: dict[str, list[float]] = {}
        self.head_at: float | None = None
        self.wakes = 0
        self.behind = 0

    def reset(self) -> None:
        self.parts, self.head_at, self.wakes, self.behind = {}, None, 0, 0
        LOOKS_HELD[0] = 0

    def add(self, step: str, seconds: float) -> None:
        part = self.parts.setdefault(step, [0.0, 0])
        part[0] += seconds
        part[1] += 1

    def wrap(self, owner: Any, attr: str, step: str) -> None:
        inner = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                got = inner(*args, **kwargs)
            finally:
                self.add(step, time.perf_counter() - started)
            if step == "sleep" and got:
                self.wakes += 1
            if step == "place":
                if got and self.head_at is None:
                    self.head_at = time.perf_counter()
                self.behind += 0 if got else 1
            return got

        setattr(owner, attr, timed)

    def install(self) -> None:
        from memgov import _claim, _runs
        from memgov._files import flock as _flock
        from memgov._ledger import (
            admission as _admission,
            deadnames as _deadnames,
            ledger as _ledger,
            records as _records,
            wake as _wake,
        )

        time_lock_holds()  # counts the flood files judged under the lock (LOOKS_HELD)

        self.wrap(_ledger.DeviceLedger, "first_look", "first_look")
        self.wrap(_admission, "_look", "look")
        self.wrap(_flock.AdmissionLock, "__enter__", "lock_wait")
        self.wrap(_ledger.QueuePlace, "first", "place")
        self.wrap(_wake.Waker, "sleep", "sleep")
        self.wrap(_admission._Queue, "join", "join")
        self.wrap(_admission._Queue, "leave", "leave")
        self.wrap(_claim, "_govern", "govern")
        self.wrap(_runs, "start", "runs")
        self.wrap(_deadnames, "flush", "flush")
        self.wrap(_deadnames, "reload", "reload")
        # Whether the flooded folder itself is slow, apart from judging its names: the scans
        # (inside the looks), the record's write (create, lock, rename in claims/ or queue/)
        # and removals (the queue ticket's, inside the claim).
        self.wrap(_ledger.DeviceLedger, "scan", "scan")
        self.wrap(_records, "_write_locked", "write")
        self.wrap(_ledger.DeviceLedger, "remove", "remove")

    def report(self, ended: float) -> dict[str, Any]:
        out: dict[str, Any] = {k: [round(v[0], 6), v[1]] for k, v in self.parts.items()}
        out["wakes"] = self.wakes
        out["behind_looks"] = self.behind
        out["head_s"] = None if self.head_at is None else round(ended - self.head_at, 6)
        out["looks_held"] = LOOKS_HELD[0]
        LOOKS_HELD[0] = 0
        return out


def claimer(seed: int) -> None:
    import cProfile  # before become(): the interpreter's own files may be root's alone

    become(CLAIMER)
    import memgov

    breakdown = Breakdown() if os.environ.get(BREAKDOWN_ENV) else None
    if breakdown is not None:
        breakdown.install()
    profiles = os.environ.get(PROFILE_ENV)
    profile = cProfile.Profile() if profiles else None
    rng = random.Random(seed)
    for index in range(50):
        size = rng.choice(["1GiB", "2GiB", "4GiB", "6GiB"])
        if breakdown is not None:
            breakdown.reset()
        wall0, cpu0, main0 = time.time(), sum(os.times()[:2]), time.thread_time()
        t0 = time.perf_counter_ns()
        try:
            if profile is not None:
                profile.enable()
            held = memgov.claim(size, wait=5)
        except memgov.BudgetExceeded:
            print(json.dumps({"refused_ns": time.perf_counter_ns() - t0}), flush=True)
            continue
        except Exception as exc:  # reported: the run counts every error
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            return
        finally:
            if profile is not None:
                profile.disable()
        took = time.perf_counter_ns() - t0
        cpu = sum(os.times()[:2])
        event = {"claim_ns": took, "admission": held.reports.get("admission"), "cpu_s": cpu}
        if breakdown is not None:
            event["breakdown"] = breakdown.report(time.perf_counter())
            event.update(index=index, size=size, started=wall0, pid=os.getpid())
            event.update(claim_cpu_s=cpu - cpu0, main_cpu_s=time.thread_time() - main0)
        print(json.dumps(event), flush=True)
        if profile is not None:  # after each claim: a SIGKILL may come at any time
            profile.dump_stats(os.path.join(str(profiles), f"{os.getpid()}.prof"))
        time.sleep(0.02)
        t1 = time.perf_counter_ns()
        if profile is not None:
            profile.enable()
        held.release()
        if profile is not None:
            profile.disable()
        # The budget is held from the admission to here: what the queue behind waits for.
        done = time.perf_counter_ns()
        print(json.dumps({"release_ns": done - t1, "held_ns": done - t0 - took}), flush=True)


HOLDS_CPU: list[list[float]] = []
LOOKS_HELD: list[int] = [0, 0]
"""Empty files (the flood's) judged while this process held the admission lock, and whether it
holds it now: what the flood costs a hold, whatever the machine's load."""


def count_looks_under_the_lock() -> None:
    from memgov._ledger import records as _records

    real = _records._read

    def judged(*args: Any, **kwargs: Any) -> Any:
        got = real(*args, **kwargs)
        if got is not None and got.final:
            LOOKS_HELD[0] += LOOKS_HELD[1]
        return got

    _records._read = judged  # type: ignore[assignment]


"""time_lock_holds's CPU seconds of this thread per hold (beside the wall seconds it returns):
a hold much longer than its CPU time waited for a core, not for work."""


def time_lock_holds() -> list[float]:
    """Wrap the admission lock so that every hold of it in this process is timed (--breakdown:
    root's gc and the monitor hold it too, and a hold delays the head of the queue)."""
    from memgov._files import flock as _flock

    holds: list[float] = []
    holds_cpu: list[float] = []
    HOLDS_CPU[:] = [holds_cpu]
    count_looks_under_the_lock()
    enter, leave = _flock.AdmissionLock.__enter__, _flock.AdmissionLock.__exit__
    taken: list[tuple[float, float]] = []

    def timed_enter(self: Any) -> Any:
        got = enter(self)
        taken.append((time.perf_counter(), time.thread_time()))
        LOOKS_HELD[1] = 1
        return got

    def timed_exit(self: Any, *exc: object) -> None:
        leave(self, *exc)
        LOOKS_HELD[1] = 0
        if taken:
            wall, cpu = taken.pop()
            holds.append(time.perf_counter() - wall)
            holds_cpu.append(time.thread_time() - cpu)

    _flock.AdmissionLock.__enter__ = timed_enter  # type: ignore[method-assign]
    _flock.AdmissionLock.__exit__ = timed_exit  # type: ignore[method-assign]
    return holds


def timed_gc() -> None:
    """`memgov gc`, its admission lock holds printed on stderr as JSON (--breakdown)."""
    holds = time_lock_holds()
    sys.argv = ["memgov", "gc"]
    from memgov.cli import main

    try:
        main()
    except SystemExit:
        pass
    finally:
        said = {"gc_holds": holds, "gc_holds_cpu": HOLDS_CPU[0], "looks_held": LOOKS_HELD[0]}
        sys.stderr.write(json.dumps(said) + "\n")


def monitor(seconds: float) -> None:
    become(MONITOR)
    from memgov._gpu.devices import devices
    from memgov._ledger.ledger import DeviceLedger

    ledger = DeviceLedger(devices()[0])
    holds = time_lock_holds() if os.environ.get(BREAKDOWN_ENV) else []
    samples, over, most = 0, [], 0
    files: list[int] = []  # files in claims/ and v1/cpu/, sampled: what each scan lists
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        # Under the admission lock, as a claim of device="auto", "auto" sizing and pack's
        # planner read it (DeviceLedger.snapshot); removes nothing of others
        snap = ledger.snapshot()
        samples += 1
        most = max(most, snap.claimed)
        if snap.claimed > snap.capacity:
            over.append(snap.claimed)
        if samples % 20 == 1:
            files.append(len(os.listdir(ledger.path / "claims")))
            files.append(len(os.listdir(ledger.root / "v1" / "cpu")))
        time.sleep(0.01)
    listed = {"claims_max": max(files[0::2]), "cpu_max": max(files[1::2])}
    listed.update(claims_mean=sum(files[0::2]) // len(files[0::2]))
    listed.update(cpu_mean=sum(files[1::2]) // len(files[1::2]))
    found = {"samples": samples, "over_commits": len(over), "max_claimed": most, "files": listed}
    if holds:
        found["lock_held_ms"] = {
            "p50": nearest([int(h * 1e9) for h in holds], 50),
            "p99": nearest([int(h * 1e9) for h in holds], 99),
            "max": max(holds) * 1e3,
            "over_50ms": sum(1 for h in holds if h > 0.05),
            "cpu_of_those_over_50ms": [
                round(c * 1e3, 1) for h, c in zip(holds, HOLDS_CPU[0], strict=True) if h > 0.05
            ],
            "wall_of_those_over_50ms": [round(h * 1e3, 1) for h in holds if h > 0.05],
            "flood_files_judged_under_the_lock": LOOKS_HELD[0],
        }
    print(json.dumps(found))


def flooder(ledger: str) -> None:
    import fcntl
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    become(FLOODER)
    claims = Path(ledger, "v1", "sim0", "claims")
    own = Path(tempfile.mkdtemp(prefix="flocks-", dir=Path(ledger).parent / "flooder"))
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
        started = time.time()
        plant(claims, 2_000, f"w{wave}-")
        planted = time.time()
        plant(Path(ledger, "v1", "cpu"), 2_000, f"w{wave}-")
        print(json.dumps({"wave": [started, planted, time.time()]}), flush=True)
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


def filesystem(folder: Path) -> str:
    """The type of the filesystem ``folder`` is on (the longest mount point above it)."""
    best, kind = "", "?"
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1]
            inside = str(folder) == point or str(folder).startswith(point.rstrip("/") + "/")
            if len(fields) > 2 and inside and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def nearest(values: list[int], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1] / 1e6


def phase(
    floods: bool,
    seconds: float,
    claimers: int,
    kill_every: float,
    profile: Path | None = None,
    breakdown: Path | None = None,
    under: Path = Path("/tmp"),
) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="memgov-churn-", dir=under))
    base.chmod(0o755)
    ledger = base / "ledger"
    env = {**os.environ, "MEMGOV_DIR": str(ledger), "MEMGOV_DEVICES": "sim0:16GiB"}
    profiles = None
    if profile is not None:
        profiles = profile / ("floods" if floods else "clean")
        profiles.mkdir(parents=True, exist_ok=True)
        profiles.chmod(0o777)  # the claimers' uid writes there
        env[PROFILE_ENV] = str(profiles)
    if breakdown is not None:
        env[BREAKDOWN_ENV] = "1"
    me = [sys.executable, __file__]
    # `python -m` puts its working folder first on sys.path: run from the run's folder, so a
    # memgov/ in the caller's folder never shadows the one PYTHONPATH names (an A/B's "before").
    where = subprocess.run(
        [sys.executable, "-c", "import memgov; print(memgov.__file__)"],
        env=env,
        cwd=base,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(
        [sys.executable, "-m", "memgov", "gc"], env=env, cwd=base, check=True, capture_output=True
    )
    flood = None
    first_gc_s = None
    first_gc_rebuilt = None
    if floods:
        own = base / "flooder"  # the flooder's own files, removed with the run's folder
        own.mkdir()
        os.chown(own, FLOODER, FLOODER)
        flood = subprocess.Popen(
            [*me, "--flooder", str(ledger)], env=env, stdout=subprocess.PIPE, text=True
        )
        assert flood.stdout is not None and flood.stdout.readline().strip() == "ready"
        # The admin's remedy for the backlog: root's gc once (timed), then the churn starts
        # with the flooder still planting waves and holding its flocks.
        started = time.monotonic()
        first = subprocess.run(
            [sys.executable, "-m", "memgov", "gc", "--json"],
            env=env,
            cwd=base,
            check=True,
            capture_output=True,
            text=True,
        )
        first_gc_s = time.monotonic() - started
        # Whether it rebuilt claims/ (memgov/_ledger/compact.py; absent from a gc before that code)
        first_gc_rebuilt = json.loads(first.stdout).get("rebuilt")
    done = threading.Event()
    gc_runs = [0]

    gc_cpu = [0.0]
    gc_times: list[tuple[float, float]] = []
    gc_holds: list[float] = []
    gc_holds_cpu: list[float] = []
    gc_looks_held = [0]
    gc_command = [*me, "--gc"] if breakdown is not None else [sys.executable, "-m", "memgov", "gc"]

    def gc_loop() -> None:
        while not done.is_set():
            started = time.time()
            run = subprocess.Popen(
                gc_command,
                env=env,
                cwd=base,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE if breakdown is not None else subprocess.DEVNULL,
                text=True,
            )
            said = run.stderr.read() if run.stderr is not None else ""
            usage = os.wait4(run.pid, 0)[2]
            run.returncode = 0  # reaped above
            for line in said.splitlines():
                if line.startswith('{"gc_holds"'):
                    gc_holds.extend(json.loads(line)["gc_holds"])
                    gc_holds_cpu.extend(json.loads(line)["gc_holds_cpu"])
                    gc_looks_held[0] += json.loads(line)["looks_held"]
            gc_cpu[0] += usage.ru_utime + usage.ru_stime
            gc_runs[0] += 1
            gc_times.append((started, time.time()))

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
    claim_ns, errors, claimers_cpu = [], [], 0.0
    release_ns: list[int] = []
    held_ns: list[int] = []
    waits: list[int] = []
    holds: list[int] = []
    events: list[dict[str, Any]] = []
    for proc in finished:
        out, _ = proc.communicate()
        cpu = 0.0
        for line in out.splitlines():
            event = json.loads(line)
            claim_ns.extend([event["claim_ns"]] if "claim_ns" in event else [])
            release_ns.extend([event["release_ns"]] if "release_ns" in event else [])
            held_ns.extend([event["held_ns"]] if "held_ns" in event else [])
            errors.extend([event["error"]] if "error" in event else [])
            cpu = event.get("cpu_s", cpu)
            events.extend([event] if "breakdown" in event else [])
            waits.extend(lock_wait(event.get("admission")))
            holds.extend(lock_held(event.get("admission")))
        claimers_cpu += cpu
    done.set()
    gc_thread.join()
    watched = json.loads(watch.communicate()[0].strip().splitlines()[-1])
    flood_cpu = None
    waves: list[Any] = []
    if flood is not None:
        flood_cpu = cpu_seconds(flood.pid)
        flood.kill()
        rest = flood.communicate()[0]
        waves = [json.loads(line)["wave"] for line in rest.splitlines() if line.startswith("{")]
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
        "first_gc_rebuilt": first_gc_rebuilt,
        "memgov": where,
        "folder": str(under),
        "filesystem": filesystem(under),
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
        # release(): record, thread share and run ended; held: admission to release done
        "release_ms": {"p50": nearest(release_ns, 50), "p99": nearest(release_ns, 99)}
        if release_ns
        else None,
        "held_ms": {"p50": nearest(held_ns, 50), "p99": nearest(held_ns, 99)} if held_ns else None,
        "admission_lock_wait_ms": {"p50": nearest(waits, 50), "p99": nearest(waits, 99)}
        if waits
        else None,
        "admission_lock_held_ms": {"p50": nearest(holds, 50), "p99": nearest(holds, 99)}
        if holds
        else None,
        "monitor": watched,
        # CPU seconds: the claimers' up to their last claim; root's gc runs; the flooder's
        # whole life (its initial planting included)
        "cpu_s": {"claimers": claimers_cpu, "gc": gc_cpu[0], "flooder": flood_cpu},
        "left_at_end": {"claims": len(snap.claims), "queue": len(snap.queue)},
    }
    subprocess.run(["rm", "-rf", str(base)], check=False)
    if breakdown is not None:
        name = "floods" if floods else "clean"
        breakdown.mkdir(parents=True, exist_ok=True)
        raw = {"claims": events, "gc_runs": gc_times, "gc_holds": gc_holds, "waves": waves}
        (breakdown / f"{name}.json").write_text(json.dumps(raw) + "\n")
        result["breakdown"] = summarise_breakdown(events, gc_times, waves)
        result["breakdown"]["gc_lock_held_ms"] = sorted(round(h * 1e3, 1) for h in gc_holds)
        # CPU of each hold over 50 ms (wall, CPU): far less CPU than wall waited, not worked
        result["breakdown"]["gc_holds_over_50ms_wall_cpu_ms"] = [
            (round(h * 1e3, 1), round(c * 1e3, 1))
            for h, c in zip(gc_holds, gc_holds_cpu, strict=True)
            if h > 0.05
        ]
        result["breakdown"]["gc_flood_files_judged_under_the_lock"] = gc_looks_held[0]
    if profiles is not None:
        summarise(profiles)
    return result


def summarise_breakdown(
    events: list[dict[str, Any]], gc_times: list[Any], waves: list[Any]
) -> dict[str, Any]:
    """Mean seconds per step over every claim and over the slowest 1% (at or above p99), and
    how many of those overlapped a gc run or a flood wave, or were their process's first."""
    if not events:
        return {}
    ordered = sorted(events, key=lambda e: e["claim_ns"])
    tail = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1) :]

    def means(group: list[dict[str, Any]]) -> dict[str, Any]:
        steps: dict[str, float] = {}
        for event in group:
            for step, value in event["breakdown"].items():
                if isinstance(value, list):
                    steps[step] = steps.get(step, 0.0) + value[0]
        out: dict[str, Any] = {k: round(v / len(group), 4) for k, v in sorted(steps.items())}
        out["claim_s"] = round(sum(e["claim_ns"] for e in group) / len(group) / 1e9, 4)
        for key in ("claim_cpu_s", "main_cpu_s"):
            out[key] = round(sum(e[key] for e in group) / len(group), 4)
        heads = [e["breakdown"]["head_s"] for e in group if e["breakdown"]["head_s"] is not None]
        out["head_s"] = round(sum(heads) / len(heads), 4) if heads else None
        out["wakes"] = round(sum(e["breakdown"]["wakes"] for e in group) / len(group), 2)
        looks = [e["breakdown"].get("looks_held", 0) for e in group]
        out["flood_files_judged_under_the_lock"] = {"sum": sum(looks), "max": max(looks)}
        out["first_of_process"] = sum(1 for e in group if e["index"] == 0)
        out["claims"] = len(group)

        def overlaps(spans: list[Any], event: dict[str, Any]) -> bool:
            start, end = event["started"], event["started"] + event["claim_ns"] / 1e9
            return any(s[0] < end and s[-1] > start for s in spans)

        out["during_gc"] = sum(1 for e in group if overlaps(gc_times, e))
        out["during_wave"] = sum(1 for e in group if overlaps(waves, e))
        return out

    return {"all": means(ordered), "slowest_1pct": means(tail)}


def lock_wait(report: str | None) -> list[int]:
    """The admission lock's wait (ns) from a claim's reports["admission"] line."""
    found = re.search(r"waited ([0-9.]+) s for it", report or "")
    return [int(float(found.group(1)) * 1e9)] if found else []


def lock_held(report: str | None) -> list[int]:
    """The longest hold of the admission lock (ns) from a claim's reports["admission"] line."""
    found = re.search(r"held it at most ([0-9.]+) ms", report or "")
    return [int(float(found.group(1)) * 1e6)] if found else []


def summarise(profiles: Path) -> None:
    """Every claimer's cProfile of its claims, summed: PHASE.txt beside the phase's folder."""
    text = summed_profiles(sorted(profiles.glob("*.prof")), "claimer processes")
    if text:
        Path(f"{profiles}.txt").write_text(text)


def summarize(paths: list[Path]) -> None:
    """One line per phase of each report (--json): what docs/ledger.md's tables quote."""
    print("report phase admitted claim_p50/p99_ms lock_wait_p99_ms gc/monitor_longest_hold_ms")
    for path in paths:
        report = json.loads(path.read_text())
        for name in ("clean", "floods"):
            ph = report.get(name)
            if not ph:
                continue
            # Timed with --breakdown only
            gc_holds = ph.get("breakdown", {}).get("gc_lock_held_ms")
            gc = f"{max(gc_holds):.1f}" if gc_holds else "-"
            held = ph["monitor"].get("lock_held_ms", {}).get("max")
            monitor = f"{held:.1f}" if held is not None else "-"
            release = ph.get("release_ms") or {}
            print(
                f"{path.name} {name} {ph['admitted']} {ph['claim_ms']['p50']:.1f}/"
                f"{ph['claim_ms']['p99']:.1f} {ph['admission_lock_wait_ms']['p99']:.1f} "
                f"{gc}/{monitor} release_p50/p99_ms {release.get('p50', '-')}/"
                f"{release.get('p99', '-')} over_commits {ph['monitor']['over_commits']} "
                f"errors {ph['errors']} left {ph['left_at_end']}"
            )
        if report.get("p99_ratio") is not None:  # both phases ran
            print(f"{path.name} floods/clean p99 {report['p99_ratio']:.2f}x")


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
    parser.add_argument(
        "--phases", default="clean,floods", help="which phases to run: clean, floods or both"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="folder: each claimer's cProfile of its claims; PHASE.txt sums them",
    )
    parser.add_argument(
        "--breakdown",
        type=Path,
        help="folder: every claim's parts timed (PHASE.json raw); the means in the report",
    )
    parser.add_argument(
        "--under",
        type=lambda text: Path(text).resolve(),
        default=Path("/tmp"),
        help="the folder each phase's ledger is made in (default /tmp, memgov's default "
        "ledger's; e.g. a tmpfs such as /dev/shm or /run)",
    )
    parser.add_argument("--claimer")
    parser.add_argument("--gc", action="store_true")
    parser.add_argument("--monitor", type=float)
    parser.add_argument("--flooder")
    parser.add_argument("--summarize", type=Path, nargs="+", help="reports (--json) to sum up")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    if args.claimer is not None:
        return claimer(int(float(args.claimer) * 2**31))
    if args.monitor is not None:
        return monitor(args.monitor)
    if args.flooder is not None:
        return flooder(args.flooder)
    if args.gc:
        return timed_gc()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the processes drop to uids of their own")
    phases = args.phases.split(",")
    clean, flooded = (
        phase(
            floods,
            args.seconds,
            args.claimers,
            args.kill_every,
            args.profile,
            args.breakdown,
            args.under,
        )
        if name in phases
        else None
        for floods, name in ((False, "clean"), (True, "floods"))
    )
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
            if clean and flooded and clean["claim_ms"] and flooded["claim_ms"]
            else None
        ),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
