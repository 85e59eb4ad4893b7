"""Shared by the plain MNIST scripts: options, data, timing and the per-epoch JSON report.

No memgov and no thread setting here: these scripts stand for a user's unchanged training code.
Data: experiments/mnist's loader (numpy only; one shared memory-mapped copy for all jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "mnist"))
import mnist_data


def parse(framework: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=f"Plain {framework} MNIST loop (Keras CNN, batch 32)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=400, help="training steps per epoch")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--out", help="JSON report (default: stdout only)")
    p.add_argument("--seed", type=int, default=0)
    if framework == "torch":
        # Another common shape of script (where a speed gap was seen): Adam, and batches gathered on
        # the CPU from tensors kept in pinned host memory, copied with non_blocking=True.
        p.add_argument("--optimizer", choices=("adadelta", "adam"), default="adadelta")
        p.add_argument(
            "--gather",
            choices=("numpy", "pinned"),
            default="numpy",
            help="numpy: batches made from the numpy arrays; pinned: indexed out of "
            "torch tensors in pinned host memory",
        )
    return p.parse_args()


def data() -> tuple[Any, Any]:
    x, y, _, _ = mnist_data.load()
    return x, y


def batches(x: Any, y: Any, steps: int, batch: int, rng: Any, tensors: Any = None) -> Any:
    """``steps`` host batches (uint8 images -> float32 NHWC/NCHW by the caller), shuffled; with
    ``tensors`` (torch tensors of the same rows), the rows are gathered out of those instead."""
    import numpy as np

    idx = rng.permutation(len(x))
    for s in range(steps):
        take = np.sort(idx[(s * batch) % (len(x) - batch) :][:batch])
        if tensors is None:
            yield x[take], y[take]
        else:
            import torch

            rows = torch.from_numpy(take)
            yield tensors[0].index_select(0, rows), tensors[1].index_select(0, rows)


class Report:
    def __init__(self, framework: str, args: argparse.Namespace) -> None:
        self.doc: dict[str, Any] = {
            "framework": framework,
            "pid": os.getpid(),
            "argv": sys.argv,
            "epochs": [],
            "started": time.time(),
            "env": {
                k: v
                for k, v in os.environ.items()
                if k.startswith(("OMP_", "MKL_", "OPENBLAS_", "MEMGOV_", "CUDA_MPS_", "XLA_"))
            },
            "memgov_imported": "memgov" in sys.modules,
        }
        self.out = args.out

    def epoch(self, index: int, samples: int, t0: float, t1: float, threads: int | None) -> None:
        rec = {
            "epoch": index,
            "samples": samples,
            "t0": t0,
            "t1": t1,
            "seconds": t1 - t0,
            "samples_per_s": samples / (t1 - t0) if t1 > t0 else None,
            "framework_threads": threads,
            "os_threads": len(os.listdir("/proc/self/task")),
        }
        self.doc["epochs"].append(rec)
        print(json.dumps(rec), flush=True)
        self.save()

    def done(self, **extra: Any) -> None:
        self.doc.update(
            extra, finished=time.time(), ok=True, memgov_imported_at_end="memgov" in sys.modules
        )
        self.save()

    def save(self) -> None:
        if self.out:
            tmp = self.out + ".tmp"
            Path(tmp).write_text(json.dumps(self.doc))
            os.replace(tmp, self.out)
