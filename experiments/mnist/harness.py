"""What the three trainers share: options, data, the epoch loop, evaluation and the reports.

Each ``train_<fw>.py`` supplies only what differs per framework (device choice, model, one
epoch of steps, prediction, peak memory) as a :class:`Trainer`; timing, the report lines and the
"rogue job" allocation are done here once, so all three behave identically towards a packer.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import NoReturn, Protocol

import mnist_data
import numpy as np
import report

Batches = Iterator[tuple[np.ndarray, np.ndarray]]


class Trainer(Protocol):
    device: str  # "cpu" or "cuda:N", as reported in the start event
    channels_last: bool

    def train_epoch(self, batches: Batches) -> tuple[float, float]:
        """Train on every batch; return (mean loss, accuracy) after syncing with the device."""
        ...

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted class per image of one float32 batch, as a host array."""
        ...

    def hog(self, mib: int) -> object:
        """Allocate ``mib`` MiB on the accelerator and return what keeps it alive."""
        ...

    def peak_allocator_mib(self) -> float | None:
        """Peak memory of the framework's allocator on the device; None where unknown."""
        ...


# Optional, per trainer:
# - ``raw_images = True``: batches (training and evaluation) come as uint8 images, scaled on the
#   device by the trainer;
# - ``prepare(train_samples, batch) -> dict``: compile everything the run will execute before
#   the start report (what it returns goes into that report), so that epoch 1 is training only
#   and a packer's compilation cache is warm once a job has reported "start".


def _claim_held() -> dict[str, object] | None:
    """The memgov claim this process holds, when memgov governs it: a job too short for a
    packer's ledger sampling still reports what it claimed. memgov is looked up, never imported."""
    memgov = sys.modules.get("memgov")
    held = memgov.current() if memgov is not None else None
    return {"bytes": held.bytes, "mode": held.mode} if held is not None else None


def parse_args(framework: str, argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=f"Keras-example MNIST CNN in {framework}; reports JSON lines on stdout."
    )
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--data", default=None, help="MNIST .npz (default: the bundled copy)")
    p.add_argument(
        "--data-sha256",
        default=mnist_data.SHA256,
        help="expected sha256 of --data, or 'skip' (default: the bundled file's hash)",
    )
    p.add_argument("--limit", type=int, default=None, help="use only the first N train images")
    p.add_argument(
        "--eval-limit", type=int, default=None, help="evaluate on the first N test images only"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--hog-mib",
        type=int,
        default=0,
        help="after the first step, also hold N MiB on the accelerator (rogue job; no-op on CPU)",
    )
    p.add_argument("--eval", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--barrier",
        default=None,
        metavar="DIR",
        help="after start-up (framework and device ready), leave a file in DIR and wait until "
        "--barrier-n jobs have (or --barrier-timeout s): packed jobs then train together, so a "
        "short run measures them all at once rather than their start-up stagger",
    )
    p.add_argument("--barrier-n", type=int, default=1)
    p.add_argument("--barrier-timeout", type=float, default=40.0)
    if framework == "torch":
        p.add_argument(
            "--cuda-graph",
            action="store_true",
            help="replay each training step as one CUDA graph (GPU only; a final partial batch "
            "is skipped); cuts the CPU work per step, which packed jobs are short of",
        )
        # Both on by default: measured on an H200 with 25 jobs under MPS, they took the median
        # epoch from 6.87 s to 5.47 s (benchmarks/gpu/pack_variants.sh, results/HISTORY.md).
        p.add_argument(
            "--channels-last",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="model in NHWC memory format, which cuDNN's fast kernels use without the "
            "layout transposes NCHW costs on the GPU (default: on)",
        )
        p.add_argument(
            "--tf32",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="TF32 tensor cores for float32 matmuls, as TensorFlow and JAX use by default on "
            "Ampere and newer GPUs; torch's convolutions use TF32 already (default: on)",
        )
        p.add_argument(
            "--flat-optimizer",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="torch's Adadelta arithmetic over one flat buffer (experiments/mnist/"
            "flat_adadelta.py): a few full-GPU kernels per step instead of torch's multi-tensor "
            "kernels, which leave most of the GPU idle for a model this small (default: on)",
        )
    args = p.parse_args(argv)
    for name in ("epochs", "batch", "limit", "eval_limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.hog_mib < 0:
        p.error("--hog-mib must be >= 0")
    if args.barrier_n < 1 or not args.barrier_timeout >= 0:
        p.error("--barrier-n must be >= 1 and --barrier-timeout >= 0")
    return args


def _barrier(folder: str, n: int, timeout: float) -> tuple[int, float]:
    """Leave this job's mark in ``folder``; wait for ``n`` marks or ``timeout`` seconds.

    Returns (marks seen, seconds waited). A job that never comes (it failed at start-up, or waits
    for memory) costs the others ``timeout`` at most.
    """
    os.makedirs(folder, exist_ok=True)
    mark = os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}.ready")
    with open(mark, "w"):
        pass
    t0 = time.perf_counter()
    while True:
        seen = sum(1 for name in os.listdir(folder) if name.endswith(".ready"))
        waited = time.perf_counter() - t0
        if seen >= n or waited >= timeout:
            return seen, round(waited, 3)
        time.sleep(0.05)


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), or None elsewhere."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            return round(float(uptime.read().split()[0]) - started, 3)
    except (OSError, ValueError, IndexError):
        return None


def main(framework: str, build: Callable[[argparse.Namespace], Trainer]) -> NoReturn:
    """Entry point of a trainer script: ``build`` imports the framework and picks the device."""
    args = parse_args(framework)
    report.protect_stdout()
    report.run(lambda: _train(framework, args, build))


def _train(framework: str, args: argparse.Namespace, build: Callable[..., Trainer]) -> None:
    # Data first: a bad --data fails in milliseconds instead of after a framework import.
    entered = time.perf_counter()
    age = _process_age_s()
    expected = None if args.data_sha256.lower() == "skip" else args.data_sha256
    x_train, y_train, x_test, y_test = mnist_data.load(args.data, expected)
    x_train, y_train = x_train[: args.limit], y_train[: args.limit]
    x_test, y_test = x_test[: args.eval_limit], y_test[: args.eval_limit]
    loaded = time.perf_counter()
    trainer = build(args)
    raw = bool(getattr(trainer, "raw_images", False))
    prepare = getattr(trainer, "prepare", None)
    prepared = prepare(len(x_train), args.batch) if prepare is not None else None
    report.emit(
        "start",
        framework=framework,
        device=trainer.device,
        pid=os.getpid(),
        batch=args.batch,
        epochs=args.epochs,
        train_samples=len(x_train),
        # Where start-up went: the interpreter until this script ran (site hooks included),
        # the data, then the framework's import, its device, the model (and what prepare
        # compiled ahead).
        startup_s={
            "interpreter": age,
            "data": round(loaded - entered, 3),
            "framework": round(time.perf_counter() - loaded, 3),
        },
        **({"prepared": prepared} if prepared else {}),
        **({"claim": claimed} if (claimed := _claim_held()) else {}),
    )
    if args.barrier:
        seen, waited = _barrier(args.barrier, args.barrier_n, args.barrier_timeout)
        report.emit("barrier", seen=seen, wanted=args.barrier_n, waited_s=waited)
    t_start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    held: list[object] = []  # the rogue allocation, alive until the process exits

    def hog() -> None:
        if trainer.device == "cpu":
            print(f"--hog-mib {args.hog_mib}: no accelerator, nothing to hog", file=sys.stderr)
        else:
            held.append(trainer.hog(args.hog_mib))

    for epoch in range(1, args.epochs + 1):
        stream = mnist_data.batches(x_train, y_train, args.batch, rng, trainer.channels_last, raw)
        stream = _progress(stream, epoch, len(x_train))
        if epoch == 1 and args.hog_mib:
            stream = _after_first(stream, hog)
        t0 = time.perf_counter()
        loss, acc = trainer.train_epoch(stream)
        seconds = time.perf_counter() - t0
        report.emit(
            "epoch",
            epoch=epoch,
            seconds=round(seconds, 4),
            samples=len(x_train),
            samples_per_s=round(len(x_train) / seconds, 1),
            loss=loss,
            acc=acc,
        )

    test_acc = None
    if args.eval:
        correct = 0
        # At the training batch size, evaluation never raises the job's peak memory above what
        # training needs (measured on an H200: 1000-image eval batches took torch's allocator
        # peak from 108 to 560 MiB, JAX's from 186 to 1,396 MiB).
        test = mnist_data.batches(x_test, y_test, args.batch, None, trainer.channels_last, raw)
        for xb, yb in test:
            correct += int(np.sum(trainer.predict(xb) == yb))
        test_acc = correct / len(x_test)
    report.emit(
        "done",
        epochs=args.epochs,
        test_acc=test_acc,
        total_s=round(time.perf_counter() - t_start, 4),
        peak_allocator_mib=trainer.peak_allocator_mib(),
    )


PROGRESS_S = 2.0
"""A "progress" report at most this often within an epoch, so a packer can show live progress and
an ETA on long (CPU) epochs; a line every 2 s costs nothing next to the steps between."""


def _progress(stream: Batches, epoch: int, total: int) -> Batches:
    """Pass batches through, reporting the samples consumed so far every PROGRESS_S seconds."""
    done, last = 0, time.monotonic()
    for xb, yb in stream:
        yield xb, yb
        done += len(yb)  # the consumer's step on this batch has run when it asks for the next
        now = time.monotonic()
        if now - last >= PROGRESS_S and done < total:
            report.emit("progress", epoch=epoch, samples=done, of=total)
            last = now


def _after_first(stream: Batches, fn: Callable[[], None]) -> Batches:
    """Pass batches through, calling ``fn`` once the consumer has run its first step.

    The consumer resumes the generator only after its step on the first batch, so ``fn`` runs
    after step one (even for a one-batch epoch): the job first reaches its normal footprint and
    only then exceeds it.
    """
    pending = True
    for item in stream:
        yield item
        if pending:
            pending = False
            fn()
