"""The collector after a governed ``import torch``: with auto-enable's ``gc.freeze()`` and without.

Each run is a fresh interpreter with MEMGOV_CLAIM set (a simulated device, a ledger folder of
its own) running a training script's start-up and a few steps: ``import torch``, a small CNN,
an optimizer, a DataLoader with one forked worker, STEPS steps, a second epoch (a second worker).
Runs alternate MEMGOV_GC_FREEZE=on / off (and ungoverned, MEMGOV_CLAIM unset, as a third), so
drift of the machine falls on all alike. Per run, in the main process: the import's CPU, the
collections in it and their CPU; the full collections after it and their CPU; the CPU from the
import's end to the exit, and in all; and its DataLoader workers' CPU.

    python benchmarks/cpu/gc_freeze.py --runs 8 > results/cpu-2core/2026-11-29-gc-freeze.txt
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

PROGRAM = r"""
import gc, json, resource, sys, time
spent = {"import": [0, 0, 0.0], "after": [0, 0, 0.0]}  # collections, full ones, their CPU
phase_now, began = ["import"], [0.0]
def on_gc(phase, info):
    if phase == "start":
        began[0] = time.thread_time()
        return
    seen = spent[phase_now[0]]
    seen[0] += 1
    seen[1] += info["generation"] == 2
    seen[2] += time.thread_time() - began[0]
gc.callbacks.append(on_gc)
start = time.process_time()
import torch
phase_now[0] = "after"
after_import = time.process_time()
import torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 26 * 26, 10))
opt = torch.optim.Adadelta(model.parameters())
data = torch.utils.data.TensorDataset(torch.randn(640, 1, 28, 28), torch.randint(0, 10, (640,)))
for epoch in range(2):
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, num_workers=1)
    for x, y in loader:
        opt.zero_grad()
        F.nll_loss(F.log_softmax(model(x), 1), y).backward()
        opt.step()
import memgov._autoenable as auto
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
end = time.process_time()
print(json.dumps({
    "mode": auto.outcome.get("mode"), "frozen": auto.outcome.get("gc_frozen", 0),
    "import_cpu_s": round(after_import - start, 4),
    "collections_in_import": spent["import"][0], "full_in_import": spent["import"][1],
    "gc_cpu_in_import_s": round(spent["import"][2], 4),
    "full_after_import": spent["after"][1], "gc_cpu_after_import_s": round(spent["after"][2], 4),
    "cpu_after_import_s": round(end - after_import, 4),
    "cpu_s": round(end - start, 4), "workers_cpu_s": round(kids.ru_utime + kids.ru_stime, 4),
}))
"""

CONDITIONS = {
    "freeze on": {"MEMGOV_CLAIM": "1GiB", "MEMGOV_GC_FREEZE": "on"},
    "freeze off": {"MEMGOV_CLAIM": "1GiB", "MEMGOV_GC_FREEZE": "off"},
    "ungoverned": {},
}


def run_once(extra: dict[str, str], folder: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")}
    env.update(MEMGOV_DIR=folder, MEMGOV_DEVICES="sim0:16GiB", MEMGOV_QUIET="1", **extra)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, cwd="/"
    )
    if done.returncode != 0:
        raise SystemExit(f"the program failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=8, help="runs per condition (>= 1)")
    args = p.parse_args()
    if args.runs < 1:
        p.error(f"--runs {args.runs}: accepted a whole number >= 1")
    print(f"# {__doc__.splitlines()[0]}")
    print(f"# {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")  # fmt: skip
    seen: dict[str, list[dict]] = {name: [] for name in CONDITIONS}
    with tempfile.TemporaryDirectory(prefix="memgov-gcfreeze-") as work:
        for i in range(args.runs):
            names = list(CONDITIONS) if i % 2 == 0 else list(CONDITIONS)[::-1]
            for name in names:
                folder = os.path.join(work, f"ledger-{i}-{name.replace(' ', '-')}")
                os.mkdir(folder)
                result = run_once(CONDITIONS[name], folder)
                seen[name].append(result)
                print(f"{name:11s} {json.dumps(result)}", flush=True)
    print("# medians")
    for name, results in seen.items():
        medians = {
            key: round(statistics.median(r[key] for r in results), 4)
            for key in results[0]
            if key not in ("mode", "frozen")
        }
        print(f"{name:11s} {json.dumps(medians)}")


if __name__ == "__main__":
    main()
