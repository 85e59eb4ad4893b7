"""What memgov's own threads cost N governed processes that do nothing else: wake-ups a second
and CPU seconds of every thread but the main one (the run's sampler and the thread-share
follower), over a window, on a simulated GPU; and what one reading of the N CPU-share records
costs (what the follower did every second).

    python benchmarks/cpu/governed_idle_cost.py --n 25 --window 10 [--tree PATH] [--json OUT]

``--tree`` puts another checkout's memgov first on the processes' path (to compare with main's).
Per condition: default (sampler and follower), MEMGOV_THREADS=1 (no follower).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
IDLE = "import sys, memgov; memgov.claim('1GiB'); print('ready', flush=True); sys.stdin.read()"
SCAN = """
import json, os, sys, time
from pathlib import Path
from memgov._cpu import share as _cpushare
root = Path(os.environ["MEMGOV_DIR"])
_cpushare.peers(root=root)
t, c = time.perf_counter(), time.process_time()
for _ in range(200):
    found = _cpushare.peers(root=root)
print(json.dumps({"records": len(found),
    "wall_ms": round((time.perf_counter() - t) / 200 * 1e3, 3),
    "cpu_ms": round((time.process_time() - c) / 200 * 1e3, 3)}))
"""


def threads_of(pid: int) -> dict[str, tuple[int, int]]:
    """Every thread but the main one: (CPU ticks, context switches)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        if int(tid) == pid:
            continue
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            switches = sum(int(x.split()[1]) for x in f if "ctxt_switches" in x)
        out[tid] = (int(fields[11]) + int(fields[12]), switches)
    return out


def measure(env: dict[str, str], n: int, window: float, cwd: str) -> dict[str, Any]:
    """``cwd``: not a checkout (``python -c`` puts the working folder first on the path)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", IDLE],
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(n)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().startswith(b"ready")
        time.sleep(2)  # shares settled
        before = {p.pid: threads_of(p.pid) for p in procs}
        time.sleep(window)
        after = {p.pid: threads_of(p.pid) for p in procs}
        scan = subprocess.run(
            [sys.executable, "-c", SCAN],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()
    ticks = os.sysconf("SC_CLK_TCK")
    delta = [
        (after[p][t][0] - before[p].get(t, (0, 0))[0], after[p][t][1] - before[p].get(t, (0, 0))[1])
        for p in after
        for t in after[p]
    ]
    return {
        "threads_besides_main": sum(len(after[p]) for p in after),
        "wakeups_per_s_per_process": round(sum(d[1] for d in delta) / window / n, 2),
        "cpu_percent_of_a_core_per_process": round(
            100 * sum(d[0] for d in delta) / ticks / window / n, 3
        ),
        "one_reading_of_the_records": json.loads(scan.stdout),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose memgov runs")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.n < 1 or args.window <= 0:
        p.error("--n: accepted a whole number >= 1; --window: seconds > 0")
    report: dict[str, Any] = {"argv": sys.argv, "tree": str(args.tree.resolve()), "runs": {}}
    probe = "import memgov; print(memgov.__file__)"
    report["memgov"] = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(args.tree.resolve())},
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"memgov from {report['memgov']}", flush=True)
    for name, extra in (("default", {}), ("MEMGOV_THREADS=1", {"MEMGOV_THREADS": "1"})):
        with tempfile.TemporaryDirectory() as tmp:
            env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")}
            env.update(
                MEMGOV_DIR=f"{tmp}/ledger",
                MEMGOV_DEVICES="sim0:64GiB",
                MEMGOV_QUIET="1",
                PYTHONPATH=str(args.tree.resolve()),
                **extra,
            )
            report["runs"][name] = found = measure(env, args.n, args.window, tmp)
        print(f"{name:17} n={args.n}: {json.dumps(found)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
