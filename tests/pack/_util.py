"""Helpers of the pack tests: run `memgov pack` for real and read its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "experiments" / "mnist"
TINY = ["--", "--limit", "256", "--eval-limit", "64"]
"""Trainer arguments: 8 steps of batch 32, evaluation on 64 images."""


def held(folder: Path, seconds: float = 3) -> list[str]:
    """Trainer arguments (after TINY's) that hold each job ``seconds`` after its start report
    (a barrier in ``folder`` that no count reaches): long enough for pack's sampling (a second
    apart on a loaded host) to see the job's processes, which a job of a few steps can outrun."""
    return ["--barrier", str(folder), "--barrier-n", "999", "--barrier-timeout", f"{seconds:g}"]


def mnist_args(
    out: Path,
    *options: str,
    n: int = 2,
    epochs: int = 1,
    trainer: Sequence[str] = TINY,
    experiment: str = str(MNIST),
) -> list[str]:
    """`memgov pack` arguments: ``n`` jobs of ``experiment`` (experiments/mnist) on the CPU,
    ``epochs`` epochs each, no progress display, report into ``out``; ``options`` are further
    pack options and ``trainer`` the trainer's arguments (``--`` first)."""
    return [
        *("--n", str(n), "--device", "cpu", *options, experiment),
        *("--epochs", str(epochs), "--out", str(out), "--no-progress", *trainer),
    ]


def pack_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "memgov", "pack", *args]


def run_pack(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pack_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ),
    )


@contextmanager
def pack_running(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`memgov pack` in the background, output piped, for a test to signal; killed at the end if
    the test left it running."""
    proc = subprocess.Popen(
        pack_cmd(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def report(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "report.json").read_text())
    return data
