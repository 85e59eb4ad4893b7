"""The CPU thread budget of a process (MEMGOV_THREADS, or set by memgov pack), shared part.

Packed jobs that each start one thread per core spin against each other until the whole host runs
slower than one job alone (docs/pack.md, "Fast by default": 8 torch jobs, 3,129 samples/s with
default threads, 50,868 with one thread each). This module sets what every framework's native
libraries read from the environment; each adapter sets its own framework's thread pools through
the framework's API (torch.set_num_threads, tf.config.threading), because an already loaded
library no longer reads the environment.

XLA (JAX) has no flag that caps its CPU thread pools: ``--xla_cpu_multi_thread_eigen=false`` is
still accepted but left 2-4 threads working with jaxlib 0.10.2 (benchmarks/xla_threads.py), and
an unknown flag in XLA_FLAGS aborts the process, so memgov writes no XLA flag. XLA sizes its pools
from the CPU affinity mask (1 thread under ``taskset -c 0``): the lever for a packer that assigns
cores.
"""

from __future__ import annotations

import os

ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
"""Read by OpenMP, MKL, OpenBLAS, Accelerate and numexpr when they load; children inherit them."""


def apply_env(threads: int | None) -> str | None:
    """Set the thread variables to ``threads``; a smaller value the user chose is kept.

    Returns a one-line report, or None when there is no thread budget.
    """
    if not threads:
        return None
    kept = []
    for var in ENV_VARS:
        current = os.environ.get(var, "").strip()
        if current.isdigit() and 0 < int(current) <= threads:
            kept.append(f"{var}={current}")
            continue
        os.environ[var] = str(threads)
    note = f"{threads} CPU thread(s) for OpenMP/MKL/OpenBLAS in this process and its children"
    if kept:
        note += f" (kept the smaller {', '.join(kept)})"
    return note
