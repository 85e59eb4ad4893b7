"""One torch training step of experiments/mnist, alone on the GPU: kernels, GPU time, wall time.

Per trainer variant (flags of train_torch.py): wall ms per step over 100 steps, then one profiled
epoch of 100 steps (torch.profiler): GPU operations and GPU-busy microseconds per step, and the
optimizer's share of them.
    python3 benchmarks/gpu/torch_step_profile.py --out $OUT/torch_step_profile.json \\
        --variant default= --variant torch-adadelta=--no-flat-optimizer
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench.py
from bench import variant

ROOT = Path(__file__).resolve().parents[2]
MARK = "probe.optimizer_step"
sys.path.insert(0, str(ROOT / "experiments" / "mnist"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--variant", action="append", default=[], type=variant, metavar="NAME=FLAGS")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: script check")
    args = p.parse_args()
    import harness
    import mnist_data
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    from train_torch import TorchTrainer

    x, y, _, _ = mnist_data.load()
    x, y = x[: 32 * args.steps], y[: 32 * args.steps]
    gpu = args.device == "gpu"
    out: dict[str, object] = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if gpu else None,
    }
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]
    for name, flags in args.variant or [("default", "")]:
        torch.set_float32_matmul_precision("highest")  # --tf32 sets it; each starts from torch's
        argv = ["--device", args.device, *shlex.split(flags)]
        trainer = TorchTrainer(harness.parse_args("torch", argv))
        rng = np.random.default_rng(0)

        def epoch(trainer: TorchTrainer = trainer, rng: np.random.Generator = rng) -> None:
            trainer.train_epoch(mnist_data.batches(x, y, 32, rng, trainer.channels_last))

        for _ in range(3):
            epoch()
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        epoch()
        wall = (time.perf_counter() - t0) / args.steps
        step = trainer.opt.step

        def marked_step(step: object = step) -> None:
            with torch.profiler.record_function(MARK):
                step()  # type: ignore[operator]

        trainer.opt.step = marked_step
        with profile(activities=activities) as prof:
            epoch()
        trainer.opt.step = step
        every = prof.key_averages()
        # Annotations (ours, torch's "Optimizer.step#...") sum the kernels under them: left out.
        kernels = [
            e
            for e in every
            if e.device_type.name == "CUDA" and not e.key.startswith((MARK, "Optimizer."))
        ]
        optimizer = [e for e in every if e.key == MARK]
        n = args.steps
        out[name] = {
            "flags": flags,
            "optimizer": trainer.optimizer,
            "wall_ms_per_step": round(wall * 1e3, 4),
            "gpu_ops_per_step": round(sum(e.count for e in kernels) / n, 2),
            "gpu_busy_us_per_step": round(sum(e.device_time_total for e in kernels) / n, 2),
            "optimizer_gpu_us_per_step": round(
                max((e.device_time_total for e in optimizer), default=0) / n, 2
            ),
            "optimizer_cpu_us_per_step": round(
                max((e.cpu_time_total for e in optimizer), default=0) / n, 2
            ),
            "ops": sorted(
                (
                    [e.key[:90], round(e.count / n, 2), round(e.device_time_total / n, 2)]
                    for e in kernels
                ),
                key=lambda r: -r[2],
            )[:25],
        }
        print(name, {k: v for k, v in out[name].items() if k != "ops"}, flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
