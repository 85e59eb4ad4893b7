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
import os
import random
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench.py
from bench import (
    down,
    ended,
    ledger_env,
    nearest_rank,
    release_workers,
    report_head,
    start_workers,
    worker_results,
)

GIB = 2**30
TOTAL = 16 * GIB


def worker(seconds: float, wait: float, seed: int) -> None:
    import memgov

    rng = random.Random(seed)
    # Warm-up (imports, ledger folders), queued: 64 starting at once can fill the device.
    memgov.claim("1GiB", wait=600).release()
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
    return {
        "count": len(values),
        "p50": nearest_rank(values, 50),
        "p99": nearest_rank(values, 99),
        "max": max(values),
        "over_1000ms": sum(1 for v in values if v > 1000),
    }


def run(n: int, seconds: float, wait: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memgov-fair-") as tmp:
        env = ledger_env(Path(tmp) / "ledger", "fair0:16GiB")
        worker_args = (str(seconds), str(wait))
        procs = start_workers(
            ([sys.executable, __file__, "--worker", *worker_args, str(i)] for i in range(n)), env
        )
        sampler = Sampler(Path(tmp) / "ledger" / "v1" / "fair0")
        sampler.start()
        release_workers(procs)
        results = worker_results(procs, timeout=seconds + wait + 300)
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
    report = report_head("ledger_fairness", shared_with_other_work=True)
    report["result"] = row = run(args.n, args.seconds, args.wait)
    ended(report)
    for key in ("head_wait_while_fits_ms", "overrun_past_wait_ms", "admission_wait_ms"):
        s = row[key]
        if s["count"]:
            print(
                f"{key:26} n={s['count']:>6} p50={down(s['p50'], 1):>8} "
                f"p99={down(s['p99'], 1):>8} max={down(s['max'], 1):>8} >1s={s['over_1000ms']}"
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
