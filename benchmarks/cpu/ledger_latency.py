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
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def down(value: float, digits: int = 2) -> str:
    """``value`` truncated, never rounded up, for the printed table (the JSON keeps every digit)."""
    return f"{math.floor(value * 10**digits) / 10**digits:.{digits}f}"


def percentile(values: list[int], pct: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1] / 1e6


def run_n(n: int, cycles: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memgov-bench-") as tmp:
        env = dict(os.environ)
        env.pop("MEMGOV_HOLDER", None)
        # Room for every claimer at once: no claim is ever refused or queued.
        env.update(MEMGOV_DIR=str(Path(tmp) / "ledger"), MEMGOV_DEVICES=f"bench0:{n + 1}GiB")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(cycles)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(n)
        ]
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"worker {proc.pid} failed to start: {line!r}")
        start = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"worker {proc.pid} exited with {proc.returncode}")
            results.append(json.loads(out))
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


def machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": commit or None,
        "ledger_parent": tempfile.gettempdir(),
        "loadavg_1_5_15_at_start": os.getloadavg(),
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
        "machine": machine(),
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
    report["machine"]["loadavg_1_5_15_at_end"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
