"""Why 25 packed torch jobs reach ~9.6x one job, not 13x: measurements for docs/pack.md.

1. Kernels and CPU time per training step of experiments/mnist's torch trainer (torch.profiler,
   one process alone).
2. Host CPU busy % (per core, sampled every 0.5 s) while `memgov pack --n 25` trains: near 100 %
   means the packed jobs are CPU-bound; well below means they wait on the GPU.

    python benchmarks/gpu/pack_diagnose.py --out $OUT/pack_diagnose.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "experiments" / "mnist"

PROFILE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
import harness, mnist_data
from train_torch import TorchTrainer
args = harness.parse_args("torch", ["--device", "gpu", "--limit", "3200"])
trainer = TorchTrainer(args)
x, y, _, _ = mnist_data.load()
x, y = x[:3200], y[:3200]
rng = np.random.default_rng(0)
trainer.train_epoch(mnist_data.batches(x, y, 32, rng, False))  # warm-up: cuDNN, allocator
steps = 100
t0 = time.perf_counter()
trainer.train_epoch(mnist_data.batches(x, y, 32, rng, False))
wall = (time.perf_counter() - t0) / steps
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    trainer.train_epoch(mnist_data.batches(x, y, 32, rng, False))
events = prof.key_averages()
kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
               "cudaLaunchKernelExC", "cuLaunchKernelEx"))
memcpy = sum(e.count for e in events if "Memcpy" in e.key and e.device_type.name == "CUDA")
top = sorted(((e.key, e.count) for e in events if e.device_type.name == "CUDA"),
             key=lambda kv: -kv[1])[:25]
print(json.dumps({"steps": steps, "wall_ms_per_step": wall * 1e3,
                  "gpu_ops_per_step": kernels / steps, "launch_calls_per_step": launches / steps,
                  "memcpy_per_step": memcpy / steps, "top_gpu_ops": top}))
"""


def cpu_sampler(stop: threading.Event, samples: list[list[float]]) -> None:
    psutil.cpu_percent(percpu=True)
    while not stop.wait(0.5):
        samples.append(psutil.cpu_percent(percpu=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result: dict[str, Any] = {"cpus": os.cpu_count()}
    done = subprocess.run(
        [sys.executable, "-c", PROFILE, str(MNIST)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=MNIST,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    result["profile"] = (
        json.loads(lines[-1]) if lines else {"rc": done.returncode, "stderr": done.stderr[-2000:]}
    )
    work = Path(tempfile.mkdtemp(prefix="memgov-diag-"))
    env = {**os.environ, "MEMGOV_DIR": str(work / "ledger"), "PYTHONUNBUFFERED": "1"}
    samples: list[list[float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=cpu_sampler, args=(stop, samples), daemon=True)
    sampler.start()
    t0 = time.time()
    pack = subprocess.run(
        [
            sys.executable,
            "-m",
            "memgov",
            "pack",
            "--n",
            "25",
            "--framework",
            "torch",
            "--mode",
            "claim",
            "--epochs",
            "3",
            "--no-progress",
            "--out",
            str(work / "pack"),
            str(MNIST),
            "--",
            "--eval-limit",
            "500",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    stop.set()
    sampler.join()
    report_path = work / "pack" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    busy = [sum(s) / len(s) for s in samples]
    result["pack"] = {
        "rc": pack.returncode,
        "wall_s": round(time.time() - t0, 1),
        "aggregate_samples_per_s": report.get("aggregate_samples_per_s"),
        "speedup": report.get("speedup"),
        "solo_samples_per_s": report.get("solo_samples_per_s"),
        "epoch_s": report.get("epoch_s"),
        "window_s": report.get("window_s"),
        "cpu_busy_pct_samples": [round(b, 1) for b in busy],
        "cpu_busy_pct_max": max(busy, default=None),
        "stderr_tail": pack.stderr[-1500:],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    prof = result["profile"]
    print(json.dumps({k: v for k, v in prof.items() if k != "top_gpu_ops"}))
    for key, count in prof.get("top_gpu_ops", [])[:12]:
        print(f"  {count / max(1, prof.get('steps', 1)):6.2f}/step  {key[:90]}")
    p = result["pack"]
    print(
        f"pack rc={p['rc']} agg={p['aggregate_samples_per_s']} x1={p['speedup']} "
        f"epoch={p['epoch_s']} cpu busy % (all cores): max {p['cpu_busy_pct_max']}, "
        f"samples {p['cpu_busy_pct_samples'][:80]}"
    )


if __name__ == "__main__":
    main()
