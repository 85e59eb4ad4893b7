"""What NVML's process list costs beside many MPS clients, and what a client under MPS's memory
limit can read of its own use without it.

    python3 benchmarks/gpu/nvml_lists.py [--n 1,25] [--out DIR]

For each N: N governed processes (MEMGOV_CLAIM=1600MiB under `memgov mps start`, as
scripts_checks' memgov_mps) start at once; each, right after its CUDA context (before any
tensor), reports what ``torch.cuda.mem_get_info`` says (free and total), MPS's limit in its
environment, NVML's figure for its own PID, and the CPU and wall time of its one process list
(``nvmlDeviceGetComputeRunningProcesses``). Once all N hold their contexts: ten lists in this
process, one after another, then three in each client at once. What it answers: does a start-up's
list cost CPU that grows with the clients beside it (a profile of startup_burst timed by each
thread's CPU clock said 159 ms a call among 25; Python 3.12's profiler sees every thread, so
that clock mixed threads: measured here directly), and is the limit minus the free memory the
client's own use as NVML counts it
(measured before: under the limit, free is the limit minus the client's use)? Raw JSON:
OUT/nvml_lists.json.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scripts_checks as sc
import threads_checks as tc

CLIENT = """
import json, os, sys, time
import torch
free, total = torch.cuda.mem_get_info()  # the context, made now; no tensor yet
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)


def listed():
    cpu, wall = time.thread_time(), time.monotonic()
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return procs, time.thread_time() - cpu, time.monotonic() - wall


procs, cpu, wall = listed()
own = [p.usedGpuMemory for p in procs if p.pid == os.getpid()]
print(json.dumps({"pid": os.getpid(), "free": free, "total": total,
                  "limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
                  "nvml_own": own[0] if own else None, "listed": len(procs),
                  "list_cpu_s": cpu, "list_wall_s": wall}), flush=True)
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.05)
later = [listed()[1:] for _ in range(3)]
print(json.dumps({"pid": os.getpid(), "concurrent": later}), flush=True)
"""


def measure(n: int, env: dict[str, str], work: Path) -> dict[str, Any]:
    import pynvml

    program = work / "client.py"
    program.write_text(CLIENT)
    go = work / f"go-{n}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(program), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    first = [json.loads(p.stdout.readline() or "{}") for p in procs]  # type: ignore[union-attr]
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    here = []
    for _ in range(10):
        cpu, wall = time.thread_time(), time.monotonic()
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        here.append((time.thread_time() - cpu, time.monotonic() - wall, len(listed)))
    go.touch()
    later = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        later.append({"rc": proc.returncode, **json.loads(out or "{}"), "err": err[-800:]})
    return {"n": n, "clients": first, "here": here, "concurrent": later}


def summary(got: dict[str, Any]) -> str:
    clients = [c for c in got["clients"] if "free" in c]
    mib = 2**20
    lines = [f"n={got['n']}: {len(clients)} clients reported"]
    for c in clients[:3]:
        limit = c.get("limit") or ""
        text = limit.partition("=")[2]
        limit_mib = int(text[:-1]) if text.endswith("M") and text[:-1].isdigit() else None
        own = None if limit_mib is None else limit_mib - c["free"] // mib
        nvml = None if c["nvml_own"] is None else c["nvml_own"] // mib
        lines.append(
            f"  pid {c['pid']}: limit {limit!r}, total {c['total'] // mib} MiB, free "
            f"{c['free'] // mib} MiB -> limit - free {own} MiB; NVML own {nvml} MiB"
        )
    lists = [c["list_cpu_s"] for c in clients]
    walls = [c["list_wall_s"] for c in clients]
    if lists:
        lines.append(
            f"  each client's list at start-up: CPU median {statistics.median(lists):.4f} s, max "
            f"{max(lists):.4f}; wall median {statistics.median(walls):.4f} s"
        )
    here = got["here"]
    lines.append(
        f"  ten lists here, all {got['n']} alive: CPU median "
        f"{statistics.median(h[0] for h in here):.4f} s, wall median "
        f"{statistics.median(h[1] for h in here):.4f} s, {here[0][2]} processes listed"
    )
    conc = [t for c in got["concurrent"] for t in c.get("concurrent", [])]
    if conc:
        lines.append(
            f"  three lists in every client at once: CPU median "
            f"{statistics.median(t[0] for t in conc):.4f} s, wall median "
            f"{statistics.median(t[1] for t in conc):.4f} s"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", default="1,25")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import pynvml

    pynvml.nvmlInit()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = {**os.environ, "MEMGOV_DIR": str(work / "ledger")}
        for n in (int(x) for x in args.n.split(",")):
            cond = sc.condition("memgov_mps", "1600MiB", total)
            with tc.mps_for(cond, base, work, {}) as env:
                got = measure(n, {**env, **cond["env"]}, work)
            results.append(got)
            print(summary(got), flush=True)
            (args.out / "nvml_lists.json").write_text(
                json.dumps({"argv": sys.argv, "runs": results}, indent=1)
            )


if __name__ == "__main__":
    main()
