"""What MPS's per-client memory limit costs a training step, apart from everything else memgov does.

    python3 benchmarks/gpu/mps_limit_cost.py [--alone 6] [--together 3] [--n 10] [--out DIR]

The same small torch loop (the PyTorch examples' MNIST network, batches of 64 copied each step from
pinned host memory, Adadelta) under one MPS daemon started by hand, in five conditions: ``plain``
(OMP_NUM_THREADS=1), ``limit`` (plus CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, the limit memgov's hard
claims set; 1,600 MiB, above what the loop needs; no memgov), ``memgov`` (MEMGOV_CLAIM=1600MiB
alone: memgov sets that limit itself, caps torch's allocator and shares the threads),
``memgov_threads1`` (plus MEMGOV_THREADS=1: one fixed thread, no follower) and ``memgov_noruns`` (a
claim that starts no run: no sampler thread). Each process reports its threads' CPU seconds.
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

LIMIT = "0=1600M"
JOB = r"""
import json, os, sys, time
launched = float(sys.argv[1]); steps = int(sys.argv[2]); warm = int(sys.argv[3])
if os.environ.get("MLC_NO_RUNS") == "1":  # the claim starts no run: no sampler thread
    import memgov._runs
    memgov._runs.start = lambda *args, **kwargs: None
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
import threading
names = {t.ident: t.name for t in threading.enumerate()}
threads = {}
for ident in sys._current_frames():
    name = names.get(ident, "python-unnamed")
    seconds = time.clock_gettime(time.pthread_getcpuclockid(ident))
    threads[name] = round(threads.get(name, 0.0) + seconds, 3)
tasks = {}
for tid in os.listdir("/proc/self/task"):
    with open("/proc/self/task/%s/stat" % tid) as f:
        text = f.read()
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    tasks[comm] = round(tasks.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / 100, 2)
print(json.dumps({"steps_per_s": rate, "cpu_s": sum(os.times()[:2]), "first_step_s": first,
                  "limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
                  "torch_threads": torch.get_num_threads(), "python_threads_cpu_s": threads,
                  "tasks_cpu_s": tasks}))
"""


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
            child["MLC_NO_RUNS"] = "1"
    argv = [sys.executable, str(program), repr(time.time()), str(steps), str(warm)]
    return subprocess.Popen(argv, env=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def collect(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"rc": proc.returncode, "err": err.decode()[-800:]}
    return {"rc": 0, **json.loads(lines[-1])}


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
    args = parser.parse_args()
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
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
        try:
            for round_ in range(args.alone):
                for k in range(len(CONDITIONS)):
                    cond = CONDITIONS[(k + round_) % len(CONDITIONS)]
                    got = collect(launch(program, env, cond, args.steps, args.warm))
                    report["alone"].append({"round": round_ + 1, "condition": cond, **got})
                    print("alone", round_ + 1, cond, got, flush=True)
            for run in range(args.together):
                conds = [CONDITIONS[(i + run) % len(CONDITIONS)] for i in range(args.n)]
                procs = [(c, launch(program, env, c, args.steps, args.warm)) for c in conds]
                rows = [{"condition": c, **collect(proc)} for c, proc in procs]
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


if __name__ == "__main__":
    main()
