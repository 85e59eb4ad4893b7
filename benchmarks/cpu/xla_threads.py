"""Which knob limits XLA:CPU's threads? How many threads do the work of a jitted op, per setting.

For each thread of the process, its CPU time during 10 runs of a jitted 2000x2000 matmul+tanh
(from /proc/self/task/*/stat); printed: the number of threads that did at least 10 % of the
work. Unlike CPU time / wall time, this count does not change when other load shares the cores.
Each setting runs in a fresh interpreter (XLA reads XLA_FLAGS once, at backend start):

    python benchmarks/cpu/xla_threads.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench.py
from bench import THREAD_TICKS

PROBE = (
    THREAD_TICKS
    + """
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.tanh(x @ x).sum(axis=0))
x = jnp.ones((2000, 2000)); f(x).block_until_ready()
before = ticks()
for _ in range(10):
    f(x).block_until_ready()
print(busy(before))
"""
)

SETTINGS = [
    ("default", {}, []),
    ("XLA_FLAGS=--xla_cpu_multi_thread_eigen=false",
     {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}, []),
    ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}, []),
    ("taskset -c 0", {}, ["taskset", "-c", "0"]),
    ("XLA_FLAGS=--intra_op_parallelism_threads=1",
     {"XLA_FLAGS": "--intra_op_parallelism_threads=1"}, []),
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"cpu count {os.cpu_count()}; threads doing >= 10 % of the work, per run")
    for label, extra, prefix in SETTINGS:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", **extra}
        ratios = []
        for _ in range(args.repeats):
            result = subprocess.run(
                [*prefix, sys.executable, "-c", PROBE], env=env, capture_output=True, text=True
            )
            if result.returncode != 0:
                last = (result.stderr.strip().splitlines() or ["?"])[-1]
                ratios.append(f"exit {result.returncode}: {last[:120]}")
                break
            ratios.append(result.stdout.strip())
        print(f"{label:45s} {' '.join(ratios)}")


if __name__ == "__main__":
    main()
