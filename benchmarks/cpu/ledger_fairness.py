"""Fairness of the ledger's FIFO queue under contention: N processes claiming with wait=.

    python benchmarks/cpu/ledger_fairness.py [--n 64] [--seconds 20] [--wait 2] [--json PATH]

N real processes loop for a fixed time on one simulated 16 GiB device: claim a random 1-6 GiB
with ``wait=W``, hold it 20-120 ms, release. So the device is mostly full and most claims queue.

Two figures, each as p50 / p99 / max (nearest rank, milliseconds):

- **head wait while it fits**: a sampler in this process reads the ledger every 2 ms (no admission
  lock; records are renamed into place, so each read sees whole records). When the oldest queue
  ticket's request fits in the free budget, the clock starts for that ticket; it stops when the
  ticket leaves the queue (admitted, gave up or died). A FIFO that hands off at once keeps this
  near the admission time itself; one where the head must win a race for a lock does not.
- **overrun past wait=**: for every claim refused after waiting, the time claim() took beyond
  ``W``. A bounded wait should return close to its bound.

Also: admitted / refused counts and the admission wait of admitted claims. The machine is shared
and has few cores: the load average at start and end is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GIB = 2**30
TOTAL = 16 * GIB


def worker(seconds: float, wait: float, seed: int) -> None:
    import memgov

    rng = random.Random(seed)
    memgov.claim("1GiB").release()  # warm-up: imports, ledger folders
    print("ready", flush=True)
    sys.stdin.readline()  # barrier
    end = time.monotonic() + seconds
    admitted_ms: list[float] = []
    overrun_ms: list[float] = []
    errors: list[str] = []
    while time.monotonic() < end:
        size = rng.randint(1, 6) * GIB
        t0 = time.monotonic()
        try:
            held = memgov.claim(size, wait=wait)
        except memgov.BudgetExceeded:
            overrun_ms.append((time.monotonic() - t0 - wait) * 1000)
            continue
        except memgov.MemgovError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        admitted_ms.append((time.monotonic() - t0) * 1000)
        time.sleep(rng.uniform(0.02, 0.12))
        held.release()
    print(
        json.dumps({"admitted_ms": admitted_ms, "overrun_ms": overrun_ms, "errors": errors}),
        flush=True,
    )


class Sampler(threading.Thread):
    """Times how long the queue head waits while its request fits (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.done = threading.Event()
        self.fits_since: dict[str, float] = {}
        self.head_fits_ms: list[float] = []
        self.samples = 0
        self.over_commits = 0

    def _read(self, section: str) -> list[tuple[str, int]]:
        out = []
        try:
            names = sorted(os.listdir(self.folder / section))
        except FileNotFoundError:
            return out
        for name in names:
            if name.startswith("."):
                continue
            try:
                data = json.loads((self.folder / section / name).read_bytes())
            except (OSError, ValueError):
                continue  # released while listed
            out.append((name, int(data["bytes"])))
        return out

    def run(self) -> None:
        while not self.done.is_set():
            now = time.monotonic()
            queue = self._read("queue")
            claimed = sum(b for _, b in self._read("claims"))
            self.samples += 1
            # Dead records are not filtered (no lock probe here): workers never die in this run.
            if claimed > TOTAL:
                self.over_commits += 1
            present = {name for name, _ in queue}
            for name in [n for n in self.fits_since if n not in present]:
                self.head_fits_ms.append((now - self.fits_since.pop(name)) * 1000)
            if queue:
                head, size = queue[0]
                if size <= TOTAL - claimed and head not in self.fits_since:
                    self.fits_since[head] = now
            time.sleep(0.002)


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def rank(pct: float) -> float:
        return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]

    return {
        "count": len(ordered),
        "p50": rank(50),
        "p99": rank(99),
        "max": ordered[-1],
        "over_1000ms": sum(1 for v in ordered if v > 1000),
    }


def down(value: float) -> str:
    return f"{math.floor(value * 10) / 10:.1f}"


def run(n: int, seconds: float, wait: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memgov-fair-") as tmp:
        env = dict(os.environ)
        env.pop("MEMGOV_HOLDER", None)
        env.update(MEMGOV_DIR=str(Path(tmp) / "ledger"), MEMGOV_DEVICES="fair0:16GiB")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(seconds), str(wait), str(i)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(n)
        ]
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"worker {proc.pid} failed to start: {line!r}")
        sampler = Sampler(Path(tmp) / "ledger" / "v1" / "fair0")
        sampler.start()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=seconds + wait + 300)
            if proc.returncode != 0:
                raise SystemExit(f"worker {proc.pid} exited with {proc.returncode}")
            results.append(json.loads(out))
        sampler.done.set()
        sampler.join()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    errors = [e for r in results for e in r["errors"]]
    return {
        "n": n,
        "seconds": seconds,
        "wait_s": wait,
        "admitted": sum(len(r["admitted_ms"]) for r in results),
        "refused_after_wait": sum(len(r["overrun_ms"]) for r in results),
        "errors": len(errors),
        "workers_cpu_s": usage.ru_utime + usage.ru_stime,
        "error_examples": errors[:5],
        "sampler_samples": sampler.samples,
        "sampler_over_commits": sampler.over_commits,
        "head_wait_while_fits_ms": stats(sampler.head_fits_ms),
        "overrun_past_wait_ms": stats([v for r in results for v in r["overrun_ms"]]),
        "admission_wait_ms": stats([v for r in results for v in r["admitted_ms"]]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--wait", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(float(args.worker[0]), float(args.worker[1]), int(args.worker[2]))
        return
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    report: dict[str, Any] = {
        "benchmark": "ledger_fairness",
        "command": " ".join(["python", *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "git_commit": commit or None,
            "shared_with_other_work": True,
            "loadavg_1_5_15_at_start": os.getloadavg(),
        },
    }
    report["result"] = row = run(args.n, args.seconds, args.wait)
    report["machine"]["loadavg_1_5_15_at_end"] = os.getloadavg()
    for key in ("head_wait_while_fits_ms", "overrun_past_wait_ms", "admission_wait_ms"):
        s = row[key]
        if s["count"]:
            print(
                f"{key:26} n={s['count']:>6} p50={down(s['p50']):>8} p99={down(s['p99']):>8} "
                f"max={down(s['max']):>8} >1s={s['over_1000ms']}"
            )
        else:
            print(f"{key:26} n=0")
    print(
        f"workers_cpu_s={row['workers_cpu_s']:.1f} "
        f"admitted={row['admitted']} refused={row['refused_after_wait']} "
        f"errors={row['errors']} over_commits_seen={row['sampler_over_commits']}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
