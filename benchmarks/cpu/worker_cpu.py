"""The CPU a DataLoader worker and its main process use for the same batches, governed or not.

    python benchmarks/cpu/worker_cpu.py [--pairs 8] [--batches 400] [--json PATH]

The public MNIST example's input pipeline without torchvision: the 60,000 training images of
experiments/mnist/data/mnist.npz, each made a PIL image, a float tensor and normalised (as its
ToTensor and Normalize do) in one DataLoader worker, batches of 64; the main process takes
BATCHES batches and sums each. Two conditions, alternated pair by pair, each a fresh process:
``hand`` (OMP_NUM_THREADS=1) and ``memgov`` (MEMGOV_CLAIM=1GiB on a simulated 16 GiB device, a
fresh MEMGOV_DIR per pair). Per run: the main process's CPU seconds (self), its worker's
(children, once the worker has been joined) and the wall time; then each condition's medians
and memgov's minus hand's, per pair. On the GPU machine 25 governed copies of the public script
used 1.5-2.5 s more CPU per job than hand-tuned ones, in the worker too (results/HISTORY.md,
fourteenth session): this asks whether a governed process's worker costs more on its own.
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

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "experiments" / "mnist" / "data" / "mnist.npz"


def job(batches: int) -> dict[str, float]:
    import numpy as np
    import torch
    from PIL import Image

    images = np.load(MNIST)["x_train"]

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(images)

        def __getitem__(self, i: int) -> torch.Tensor:
            picture = Image.fromarray(images[i], mode="L")
            tensor = torch.from_numpy(np.array(picture, dtype=np.float32) / 255.0).unsqueeze(0)
            return (tensor - 0.1307) / 0.3081

    t0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(Images(), batch_size=64, num_workers=1, shuffle=True)
    it = iter(loader)
    total = 0.0
    for _ in range(batches):
        total += float(next(it).sum())
    del it  # the worker is shut down and joined: its CPU is in RUSAGE_CHILDREN from here
    wall = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": round(wall, 3),
        "main_cpu_s": round(me.ru_utime + me.ru_stime, 3),
        "worker_cpu_s": round(kids.ru_utime + kids.ru_stime, 3),
        "checksum": round(total, 1),
    }


def run(condition: str, batches: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")}
    with tempfile.TemporaryDirectory(prefix="memgov-workercpu-") as ledger:
        if condition == "hand":
            env["OMP_NUM_THREADS"] = "1"
        else:
            env.update(MEMGOV_CLAIM="1GiB", MEMGOV_DEVICES="sim0:16GiB", MEMGOV_DIR=ledger)
        done = subprocess.run(
            [sys.executable, __file__, "--job", str(batches)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--json", type=Path)
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job is not None:
        print(json.dumps(job(args.job)))
        return
    runs: dict[str, list[dict[str, float]]] = {"hand": [], "memgov": []}
    for pair in range(args.pairs):
        order = ("hand", "memgov") if pair % 2 == 0 else ("memgov", "hand")
        for condition in order:
            got = run(condition, args.batches)
            runs[condition].append(got)
            print(json.dumps({"pair": pair + 1, "condition": condition, **got}), flush=True)
    summary = {
        c: {
            k: statistics.median(r[k] for r in rs) for k in ("wall_s", "main_cpu_s", "worker_cpu_s")
        }
        for c, rs in runs.items()
    }
    diffs = {
        k: [round(m[k] - h[k], 3) for h, m in zip(runs["hand"], runs["memgov"], strict=True)]
        for k in ("wall_s", "main_cpu_s", "worker_cpu_s")
    }
    print(json.dumps({"medians": summary, "memgov_minus_hand_per_pair": diffs}))
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv, "runs": runs, "medians": summary}))


if __name__ == "__main__":
    main()
