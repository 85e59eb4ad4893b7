"""Early starters and late arrivals: the thread counts of staggered governed jobs, over time.

N governed torch jobs (MEMGOV_CLAIM=1GiB, simulated GPU, private ledger) arrive one every
--stagger seconds (counted from the previous job's first report); each runs small CPU matmuls
and reports torch.get_num_threads() of its main thread every 0.1 s. Per design
(MEMGOV_THREADS=auto: followed; once: computed at start only):
- total threads of all running jobs over time, against the usable cores (oversubscription);
- how long after each arrival the earlier jobs had shrunk to the new share (follow latency);
- the matmul rate (noisy on a shared machine; the thread counts are not).

    python benchmarks/cpu/threads_follow.py --n 3 --stagger 2 --life 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

JOB = """
import json, os, sys, time
import torch
x = torch.randn(256, 256)
stop = sys.argv[1]
next_report, done = 0.0, 0
while not os.path.exists(stop):
    (x @ x).sum()
    done += 1
    now = time.time()
    if now >= next_report:
        print(json.dumps({"t": now, "threads": torch.get_num_threads(), "done": done}),
              flush=True)
        next_report = now + 0.1
"""


def run(mode: str, n: int, stagger: float, life: float) -> dict[str, object]:
    ledger = tempfile.mkdtemp(prefix=f"memgov-follow-{mode}-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMGOV_", "OMP_", "MKL_"))}
    env.update(
        MEMGOV_DIR=ledger,
        MEMGOV_DEVICES="sim0:16GiB",
        MEMGOV_CLAIM="1GiB",
        MEMGOV_THREADS=mode,
        MEMGOV_QUIET="1",
    )
    procs = []
    starts = []
    firsts = []
    stop = os.path.join(ledger, "stop")
    for i in range(n):
        if i:
            time.sleep(stagger)
        starts.append(time.time())
        proc = subprocess.Popen(
            [sys.executable, "-c", JOB, stop], env=env, stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        # The next one arrives `stagger` s after this one runs (start-up on a busy host varies).
        assert proc.stdout is not None
        firsts.append(proc.stdout.readline())
    time.sleep(life)  # all run together this long, then all stop at once
    open(stop, "w").close()
    series = []
    for first, proc in zip(firsts, procs, strict=True):
        out, _ = proc.communicate(timeout=300)
        lines = [first, *out.splitlines()]
        series.append([json.loads(line) for line in lines if line.startswith("{")])
    cores = len(os.sched_getaffinity(0))
    t0, t1 = min(s[0]["t"] for s in series if s), max(s[-1]["t"] for s in series if s)
    timeline = []
    step = 0.1
    t = t0
    while t <= t1:
        total, running = 0, 0
        for s in series:
            seen = [p for p in s if p["t"] <= t]
            if seen and s[-1]["t"] >= t:
                total += seen[-1]["threads"]
                running += 1
        timeline.append((round(t - t0, 1), running, total))
        t += step
    # After each arrival (job i's first report), when had every earlier job reached the share
    # the arrival made (cores // running, at least 1)?
    latencies = []
    for i in range(1, n):
        if not series[i]:
            continue
        arrival = series[i][0]["t"]
        share = max(1, cores // (i + 1))
        done_at = []
        for s in series[:i]:
            later = [p["t"] for p in s if p["t"] >= arrival and p["threads"] <= share]
            if later:
                done_at.append(later[0] - arrival)
        if len(done_at) == i:
            latencies.append(round(max(done_at), 2))
    over = [total / cores for _, running, total in timeline if running]
    rate = sum((s[-1]["done"] / (s[-1]["t"] - s[0]["t"])) for s in series if len(s) > 1)
    return {
        "mode": mode,
        "n": n,
        "stagger_s": stagger,
        "cores": cores,
        "max_total_threads": max(total for _, _, total in timeline),
        "mean_threads_per_core": round(statistics.mean(over), 3) if over else None,
        "follow_latency_s": latencies,
        "first_job_threads_seen": sorted({p["threads"] for p in series[0]}),
        "matmuls_per_s_sum_noisy": round(rate, 1),
        "timeline_every_0.5s": [x for k, x in enumerate(timeline) if k % 5 == 0],
        "starts": [round(s - starts[0], 2) for s in starts],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--stagger", type=float, default=2.0)
    parser.add_argument(
        "--life",
        type=float,
        default=10.0,
        help="seconds all jobs run together after the last one arrived",
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    print(f"cores {len(os.sched_getaffinity(0))}, load average at start {os.getloadavg()}")
    results = []
    for mode in ("auto", "once"):
        result = run(mode, args.n, args.stagger, args.life)
        results.append(result)
        short = {k: v for k, v in result.items() if k != "timeline_every_0.5s"}
        print(json.dumps(short), flush=True)
        print(
            "  (t s, jobs running, total threads):",
            " ".join(f"{t}:{r}/{tot}" for t, r, tot in result["timeline_every_0.5s"]),
        )
    print(f"load average at end {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
