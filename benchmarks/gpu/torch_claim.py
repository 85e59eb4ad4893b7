"""PyTorch under claim("2GiB") on a real GPU (results/HISTORY.md).

A torch trainer with claim("2GiB") stays within 2 GiB in NVML's per-process figure; a process that
allocates past its claim gets OutOfMemoryError (with memgov's budget in the message) while a
neighbour keeps training and finishes. Also records the footprint calibration points (after CUDA
init, after the first step) that the torch adapter's overhead figures rest on.

    python benchmarks/gpu/torch_claim.py --out $OUT/torch_claim.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # nvml.py
from nvml import FootprintSampler

WORKER = r"""
import json, os, sys, time
role, seconds = sys.argv[1], float(sys.argv[2])
import memgov
c = memgov.claim("2GiB", name=role)
import torch, torch.nn as nn
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def mine():
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            return p.usedGpuMemory
    return None
out = {"role": role, "pid": os.getpid(), "mode": c.mode, "device": c.device}
torch.cuda.init(); torch.zeros(1, device="cuda")
out["after_init_mib"] = mine() / 2**20
out["adapter"] = c.reports.get("torch")
model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
    nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(),
    nn.Dropout(0.5), nn.Linear(128, 10)).cuda()
opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
x = torch.rand(32, 1, 28, 28, device="cuda"); y = torch.randint(0, 10, (32,), device="cuda")
loss = nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step()
torch.cuda.synchronize()
out["after_first_step_mib"] = mine() / 2**20
print(json.dumps({"event": "ready", **out}), flush=True)
steps, hog, t0 = 0, [], time.time()
try:
    while time.time() - t0 < seconds:
        opt.zero_grad(); loss = nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step()
        steps += 1
        if role == "hog":
            hog.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    out.update(result="finished", steps=steps)
except torch.OutOfMemoryError as exc:
    out.update(result="OutOfMemoryError", steps=steps, message=str(exc)[-400:],
               hog_mib=len(hog) * 256, footprint_at_oom_mib=mine() / 2**20)
out["end_mib"] = mine() / 2**20
out["max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
print(json.dumps({"event": "done", **out}), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    env = {**os.environ, "MEMGOV_DIR": os.environ.get("MEMGOV_DIR", "/tmp/memgov-gpu-check")}
    env.pop("MEMGOV_DEVICES", None)
    started = time.time()
    with FootprintSampler() as sampler:
        procs = {
            role: subprocess.Popen(
                [sys.executable, "-c", WORKER, role, str(args.seconds)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for role in ("trainer", "neighbour", "hog")
        }
        results = {}
        for role, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=300)
            lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
            done = next((x for x in lines if x["event"] == "done"), None)
            results[role] = {
                "exit": proc.returncode,
                "ready": next((x for x in lines if x["event"] == "ready"), None),
                "done": done,
                "stderr_tail": stderr[-1500:],
                "pid": proc.pid,
            }
    for res in results.values():
        res["nvml_peak_mib"] = sampler.peak_mib(res["pid"])
    report = {
        "check": "torch claim 2GiB: footprint and OOM isolation",
        "budget_mib": 2048,
        "seconds": round(time.time() - started, 1),
        "sampler_samples": sampler.samples,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(
        f"{'role':10} {'exit':>4} {'result':18} {'nvml peak MiB':>14} {'init MiB':>9} "
        f"{'1st step MiB':>12}"
    )
    for role, res in results.items():
        done, ready = res["done"] or {}, res["ready"] or {}
        print(
            f"{role:10} {res['exit']:>4} {done.get('result', '?'):18} "
            f"{res['nvml_peak_mib']!s:>14} {ready.get('after_init_mib', 0):>9.0f} "
            f"{ready.get('after_first_step_mib', 0):>12.0f}"
        )
        if done.get("message"):
            print("   OOM message tail:", done["message"][-240:].replace("\n", " | "))


if __name__ == "__main__":
    main()
