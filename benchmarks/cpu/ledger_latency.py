"""Claim+release latency of the host ledger with N concurrent claimer processes.

    python benchmarks/cpu/ledger_latency.py [--n 1 16 64] [--cycles 50] [--json PATH]

For each N, N real processes start, import memgov and wait at a barrier; then each does K cycles
of memgov.claim("1GiB") + release() on one simulated device with room for all of them (so no
claim is refused and every cycle measures the ledger, not waiting for budget). Each process times
every call with perf_counter_ns. Reported per N: p50 and p99 (nearest rank) of the cycle, of
claim() alone and of release() alone, in milliseconds, plus the wall time of the timed phase.
Each N runs in a fresh ledger folder. No GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench.py
from bench import (
    down,
    ended,
    ledger_env,
    machine,
    nearest_rank,
    release_workers,
    start_workers,
    worker_results,
)

GIB = 2**30


def worker(cycles: int) -> None:
    import memgov

    memgov.claim("1GiB").release()  # warm-up: imports, entry points, ledger folders
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every process starts its cycles together
    claim_ns, release_ns = [], []
    for _ in range(cycles):
        t0 = time.perf_counter_ns()
        held = memgov.claim("1GiB")
        t1 = time.perf_counter_ns()
        held.release()
        t2 = time.perf_counter_ns()
        claim_ns.append(t1 - t0)
        release_ns.append(t2 - t1)
    print(json.dumps({"claim_ns": claim_ns, "release_ns": release_ns}), flush=True)


def percentile(values: list[int], pct: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    return nearest_rank(values, pct) / 1e6


def run_n(n: int, cycles: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memgov-bench-") as tmp:
        # Room for every claimer at once: no claim is ever refused or queued.
        env = ledger_env(Path(tmp) / "ledger", f"bench0:{n + 1}GiB")
        procs = start_workers(
            ([sys.executable, __file__, "--worker", str(cycles)] for _ in range(n)), env
        )
        start = time.perf_counter()
        release_workers(procs)
        results = worker_results(procs, timeout=600)
        wall = time.perf_counter() - start
    claim_ns = [v for r in results for v in r["claim_ns"]]
    release_ns = [v for r in results for v in r["release_ns"]]
    cycle_ns = [
        c + r for res in results for c, r in zip(res["claim_ns"], res["release_ns"], strict=True)
    ]
    return {
        "n": n,
        "cycles_per_process": cycles,
        "samples": len(cycle_ns),
        "cycle_ms": {
            "p50": percentile(cycle_ns, 50),
            "p99": percentile(cycle_ns, 99),
            "max": max(cycle_ns) / 1e6,
        },
        "claim_ms": {"p50": percentile(claim_ns, 50), "p99": percentile(claim_ns, 99)},
        "release_ms": {"p50": percentile(release_ns, 50), "p99": percentile(release_ns, 99)},
        "wall_s": wall,
        "cycles_per_s": len(cycle_ns) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n",
        type=int,
        nargs="+",
        default=[1, 16, 64],
        help="numbers of concurrent claimer processes (default: 1 16 64)",
    )
    parser.add_argument("--cycles", type=int, default=50, help="claim+release cycles per process")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    if args.cycles < 1 or any(n < 1 for n in args.n):
        parser.error("--n and --cycles must be at least 1")
    report: dict[str, Any] = {
        "benchmark": "ledger_latency",
        "command": " ".join(["python", *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(ledger_parent=tempfile.gettempdir()),
        "results": [],
    }
    print(
        f"{'N':>4} {'samples':>8} {'cycle p50':>10} {'cycle p99':>10} {'claim p50':>10} "
        f"{'claim p99':>10} {'rel. p50':>9} {'rel. p99':>9} {'cycles/s':>9}  (ms)"
    )
    for n in args.n:
        row = run_n(n, args.cycles)
        report["results"].append(row)
        cells = [down(row[k][p]) for k in ("cycle_ms", "claim_ms") for p in ("p50", "p99")]
        print(
            f"{n:>4} {row['samples']:>8} {cells[0]:>10} {cells[1]:>10} {cells[2]:>10} "
            f"{cells[3]:>10} {down(row['release_ms']['p50']):>9} "
            f"{down(row['release_ms']['p99']):>9} {down(row['cycles_per_s'], 1):>9}",
            flush=True,
        )
    # Other processes on the machine inflate the tail: the load average says how busy it was.
    ended(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
