"""Host memory and start-up of packed jobs: ``--runner process`` against ``--runner preload``.

    python benchmarks/cpu/preload_cpu.py --out results/cpu-2core/2026-11-23-preload [--n 8]

Runs the same CPU pack twice (``memgov pack --device cpu --n N --no-solo --epochs 1`` of tiny
MNIST torch jobs), once per runner, alternating ``--repeat`` times, and reports per job: USS and
RSS (pack's sampler: peak over the job's processes; with preload the launcher and the forked
child), the time from launch to the job's first training step (its first epoch's start: import,
data, model), and for the run: wall time, CPU seconds of everything pack started (the pack
process's children's rusage, the zygote's children included), host USS peak (the jobs' sum;
with preload the zygote's own USS is reported beside it, it is shared by all jobs) and the load
average before and after. Writes OUT.json (raw reports' figures) and OUT.txt (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "experiments" / "mnist"


def one(runner: str, n: int, work: Path) -> dict[str, Any]:
    out = work / f"{runner}-{time.monotonic_ns()}"
    argv = [
        sys.executable,
        "-m",
        "memgov",
        "pack",
        "--device",
        "cpu",
        "--n",
        str(n),
        "--runner",
        runner,
        "--no-solo",
        "--epochs",
        "1",
        "--no-progress",
        "--no-history",
        "--out",
        str(out),
        str(MNIST),
        "--",
        "--limit",
        "256",
        "--eval-limit",
        "64",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "MEMGOV_DIR": str(work / "ledger")},
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads((out / "report.json").read_text())
    run = report["runs"][0]
    jobs = run["jobs"]
    startup = [
        round(j["epoch_spans"][0][0] - j["started_s"], 3)
        for j in jobs
        if j["epoch_spans"] and j["started_s"] is not None
    ]
    uss = [j["uss_mib"] for j in jobs if j["uss_mib"] is not None]
    rss = [j["rss_mib"] for j in jobs if j["rss_mib"] is not None]
    return {
        "runner": runner,
        "rc": done.returncode,
        "ok": sum(j["status"] == "ok" for j in jobs),
        "command": " ".join(["memgov", *argv[3:]]),
        "wall_s": round(wall, 2),
        "run_wall_s": run["wall_s"],
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "uss_mib": uss,
        "rss_mib": rss,
        "startup_s": startup,
        "uss_median_mib": statistics.median(uss) if uss else None,
        "startup_median_s": statistics.median(startup) if startup else None,
        "host_uss_peak_mib": run["host_uss_peak_mib"],
        "runner_block": run.get("runner_details"),
        "stderr_tail": done.stderr[-500:] if done.returncode else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.txt")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mgpl", dir="/tmp"))
    runs = []
    for _ in range(args.repeat):
        for runner in ("process", "preload"):
            runs.append(one(runner, args.n, work))
            print(
                json.dumps(
                    {
                        k: runs[-1][k]
                        for k in (
                            "runner",
                            "ok",
                            "wall_s",
                            "cpu_s",
                            "uss_median_mib",
                            "startup_median_s",
                        )
                    }
                ),
                flush=True,
            )
    result = {
        "n": args.n,
        "cores": len(os.sched_getaffinity(0)),
        "runs": runs,
        "python": sys.version.split()[0],
    }
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [
        "$ python " + " ".join(sys.argv),
        f"{args.n} tiny CPU torch jobs at once (memgov pack --device cpu), "
        f"{result['cores']} cores, shared machine",
        "runner   ok  USS/job MiB (median; min-max)  RSS/job MiB (median)  "
        "start-up s (median; max)  pack wall s  CPU s  zygote USS MiB  load avg before",
    ]
    for r in runs:
        zygote = (r["runner_block"] or {}).get("zygote_uss_mib", "-")
        lines.append(
            f"{r['runner']:8} {r['ok']:2}  {r['uss_median_mib']:7.1f} ({min(r['uss_mib']):.1f}-"
            f"{max(r['uss_mib']):.1f})          {statistics.median(r['rss_mib']):7.1f}"
            f"               {r['startup_median_s']:6.2f} ({max(r['startup_s']):.2f})"
            f"           {r['wall_s']:6.1f}  {r['cpu_s']:6.1f}  {zygote!s:>8}        "
            f"{' '.join(f'{x:.2f}' for x in r['loadavg_before'])}"
        )
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
