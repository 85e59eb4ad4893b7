"""What MPS's per-client memory limit costs a training step, apart from everything else memgov does.

    python3 benchmarks/gpu/mps_limit_cost.py [--alone 6] [--together 3] [--n 10] [--out DIR]

The same small torch loop (the PyTorch examples' MNIST network, batches of 64 copied each step from
pinned host memory, Adadelta) under one MPS daemon started by hand, in five conditions: ``plain``
(OMP_NUM_THREADS=1), ``limit`` (plus CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, the limit memgov's hard
claims set; 1,600 MiB, above what the loop needs; no memgov), ``memgov`` (MEMGOV_CLAIM=1600MiB
alone: memgov sets that limit itself, caps torch's allocator and shares the threads),
``memgov_threads1`` (plus MEMGOV_THREADS=1: one fixed thread, no follower) and ``memgov_noruns`` (a
claim that starts no run: no sampler thread). Each process's CPU by thread comes from
scripts_checks' exit probe. The ledger is a folder of the call's own, empty when it starts: no
claim is sized from an earlier run.
``alone``: one process at a time, the conditions in turn (the order rotated each round), ALONE
rounds; ``together``: N processes at once, the conditions dealt out in turn (rotated each run),
TOGETHER runs: each condition's processes meet the same machine at the same moment, so drift
between runs cancels. Per process: steps/s over the steps after the first WARM, CPU seconds, and
the seconds from launch to the first step (context included). Raw JSON to OUT/mps_limit_cost.json,
a summary on stdout.
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

import scripts_checks as sc

LIMIT = "0=1600M"
JOB = r"""
import json, os, sys, time
launched = float(sys.argv[1]); steps = int(sys.argv[2]); warm = int(sys.argv[3])
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        return F.log_softmax(self.fc2(self.dropout2(F.relu(self.fc1(x)))), dim=1)


model = Net().cuda()
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
data = torch.randn(64, 1, 28, 28).pin_memory()
target = torch.randint(0, 10, (64,)).pin_memory()
first = None
for step in range(steps):
    if step == warm:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    x, y = data.to("cuda", non_blocking=True), target.to("cuda", non_blocking=True)
    optimizer.zero_grad()
    loss = F.nll_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        loss.item()
    if first is None:
        first = time.time() - launched
torch.cuda.synchronize()
rate = (steps - warm) / (time.perf_counter() - t0)
print(json.dumps({"pid": os.getpid(), "steps_per_s": rate, "first_step_s": first,
                  "limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")}))
"""
"""The loop; scripts_checks' exit probe (on PYTHONPATH) adds its CPU by thread and its torch
threads, and leaves out the run sampler where SCRIPTS_NO_RUNS=1."""

PROBED = {
    "cpu_s": "self_cpu_s",
    "torch_threads": "threads",
    "python_threads_cpu_s": "python_threads_cpu_s",
    "tasks_cpu_s": "tasks_cpu_s_by_comm",
}
"""This report's name for each figure of the probe's (scripts_checks.PROBE)."""


CONDITIONS = ("plain", "limit", "memgov", "memgov_threads1", "memgov_noruns")


def launch(program: Path, env: dict[str, str], condition: str, steps: int, warm: int):
    child = dict(env)
    if condition == "limit":
        child["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = LIMIT
    elif condition.startswith("memgov"):
        child.pop("OMP_NUM_THREADS")
        child["MEMGOV_CLAIM"] = "1600MiB"
        if condition == "memgov_threads1":
            child["MEMGOV_THREADS"] = "1"
        if condition == "memgov_noruns":
            child["SCRIPTS_NO_RUNS"] = "1"
    argv = [sys.executable, str(program), repr(time.time()), str(steps), str(warm)]
    return subprocess.Popen(argv, env=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def collect(proc: subprocess.Popen[bytes], probed: Path) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"rc": proc.returncode, "err": err.decode()[-800:]}
    got = json.loads(lines[-1])
    probe = json.loads((probed / f"{got['pid']}.json").read_text())
    return {"rc": 0, **got, **{mine: probe.get(theirs) for mine, theirs in PROBED.items()}}


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    found = [r[key] for r in rows if r.get("rc") == 0]
    return round(statistics.median(found), 3) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alone", type=int, default=6, help="pairs of single processes")
    parser.add_argument("--together", type=int, default=3, help="runs of N processes at once")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--summarize", type=Path, nargs="+", help="print reports, run nothing")
    args = parser.parse_args()
    if args.summarize:
        for path in args.summarize:
            print(f"== {path}")
            print("\n".join(summarize(json.loads(path.read_text()))))
        return
    for option, value, least in (
        ("--alone", args.alone, 0),
        ("--together", args.together, 0),
        ("--n", args.n, 1),
        ("--warm", args.warm, 0),
    ):
        if value < least:
            parser.error(f"{option} {value}: accepted a whole number >= {least}")
    if args.steps <= args.warm:
        parser.error(f"--steps {args.steps}: accepted a whole number above --warm ({args.warm})")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"argv": sys.argv, "limit": LIMIT, "alone": [], "together": []}
    with tempfile.TemporaryDirectory(prefix="mps-limit-") as tmp:
        work = Path(tmp)
        program = work / "job.py"
        program.write_text(JOB)
        pipe, log = work / "pipe", work / "log"
        pipe.mkdir()
        log.mkdir()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")},
            "MEMGOV_DIR": str(work / "ledger"),
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(log),
            "OMP_NUM_THREADS": "1",
        }
        env.pop("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", None)
        env = sc.probe_env(work, env)
        probed = Path(env["SCRIPTS_PROBE_DIR"])
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
        try:
            for round_ in range(args.alone):
                for k in range(len(CONDITIONS)):
                    cond = CONDITIONS[(k + round_) % len(CONDITIONS)]
                    got = collect(launch(program, env, cond, args.steps, args.warm), probed)
                    report["alone"].append({"round": round_ + 1, "condition": cond, **got})
                    print("alone", round_ + 1, cond, got, flush=True)
            for run in range(args.together):
                conds = [CONDITIONS[(i + run) % len(CONDITIONS)] for i in range(args.n)]
                procs = [(c, launch(program, env, c, args.steps, args.warm)) for c in conds]
                rows = [{"condition": c, **collect(proc, probed)} for c, proc in procs]
                report["together"].append({"run": run + 1, "jobs": rows})
                print("together", run + 1, summary(rows), flush=True)
        finally:
            subprocess.run(
                ["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True, timeout=30
            )
            report["summary"] = {
                "alone": summary(report["alone"]),
                "together": [summary(r["jobs"]) for r in report["together"]],
            }
            (args.out / "mps_limit_cost.json").write_text(json.dumps(report, indent=1))
            print(json.dumps(report["summary"], indent=1))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of each condition, and each condition's steps/s over plain's."""
    out: dict[str, Any] = {}
    for cond in CONDITIONS:
        mine = [r for r in rows if r.get("condition") == cond]
        out[cond] = {key: median(mine, key) for key in ("steps_per_s", "cpu_s", "first_step_s")}
    base = out["plain"]["steps_per_s"]
    for cond in CONDITIONS[1:]:
        got = out[cond]["steps_per_s"]
        out[f"{cond}_x_plain"] = round(got / base, 4) if got and base else None
    return out


def summarize(report: dict[str, Any]) -> list[str]:
    """A report's summaries (steps/s, CPU and first step, medians per condition, each against
    plain), then, per process where the report has them, the CPU of its threads: the main
    thread's, all threads named python3 (the main thread, the OpenBLAS and OpenMP pools,
    Python's threads) and memgov's own."""
    lines = [f"alone: {json.dumps(report['summary']['alone'])}"]
    lines += [
        f"together {i}: {json.dumps(t)}" for i, t in enumerate(report["summary"]["together"], 1)
    ]
    rows = {
        "alone": report["alone"],
        "together": [job for run in report["together"] for job in run["jobs"]],
    }
    for name, jobs in rows.items():
        jobs = [j for j in jobs if j.get("rc") == 0 and j.get("python_threads_cpu_s")]
        if not jobs:
            continue
        lines.append(f"{name}, per process (medians): cpu_s main_thread_s python3_s memgov_s")
        for cond in CONDITIONS:
            mine = [j for j in jobs if j["condition"] == cond]
            if not mine:
                continue
            figures = [
                [j["cpu_s"] for j in mine],
                [j["python_threads_cpu_s"].get("MainThread", 0.0) for j in mine],
                [(j.get("tasks_cpu_s") or {}).get("python3", 0.0) for j in mine],
                [
                    sum(v for k, v in j["python_threads_cpu_s"].items() if k.startswith("memgov"))
                    for j in mine
                ],
            ]
            lines.append(f"  {cond} " + " ".join(f"{statistics.median(f):.3f}" for f in figures))
    return lines


if __name__ == "__main__":
    main()
