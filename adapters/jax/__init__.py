"""memgov's JAX adapter: no preallocation, and XLA's memory pool capped from the budget.

JAX preallocates 75 % of the GPU when its backend starts (two default jobs fill an H200). XLA's
GPU client reads three environment variables once, when the backend starts (the first jax
operation, not ``import jax``), so this adapter works through the environment:

- ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (setdefault: an explicit "true" preallocates the capped
  pool, still within the budget);
- the pool's cap as a fraction of the device's total memory: (budget - :data:`OVERHEAD`) / total.
  Exactly one of ``XLA_CLIENT_MEM_FRACTION`` (current name) and ``XLA_PYTHON_CLIENT_MEM_FRACTION``
  (older name) is written: current jaxlib raises ValueError when both are set, and only the older
  one is read by jaxlib before ~0.4.32, so memgov writes the one the user already set, else the
  older one, which every jaxlib since 0.4.1 reads as a fraction of total memory.

``apply`` runs once jax is imported and says whether the backend had already started, in which
case none of this applies to this process.
"""

from __future__ import annotations

import logging
import math
import os
import sys

from memgov.adapter import Budget, Facts, format_size

OVERHEAD = 600 * 2**20
"""Device memory of a JAX process outside XLA's pool: CUDA context, cuDNN/cuBLAS, XLA's own
buffers. A default MNIST job held 890-901 MiB in NVML with an allocator peak of 186 MiB (H200, jax
0.11.2, the project's survey: docs/adapters.md); benchmarks/gpu/jax_auto.py measures it again
against the budget."""
FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
MIN_FRACTION = 1e-6

log = logging.getLogger("memgov")
_planned: dict[str, str] = {}


class JaxAdapter:
    name = "jax"
    module = "jax"
    facts = Facts(
        distributions=("jax", "jaxlib"),
        env=("XLA_PYTHON_CLIENT_PREALLOCATE", *FRACTION_VARS, "XLA_PYTHON_CLIENT_ALLOCATOR"),
        greedy_env={"XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
        # 890-901 MiB per MNIST job without preallocation; its allocator holds more slack.
        default_claim=3 * 2**30 // 2,
        forkable=True,
        extra="jax",
        # Every program kept, in a bounded cache (JAX then locks its files): memgov/pack/warmup.py.
        compile_cache_dir="JAX_COMPILATION_CACHE_DIR",
        compile_cache_env={
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 * 2**30),
        },
    )

    def configure_env(self, budget: Budget) -> str | None:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        _planned.clear()
        if budget.bytes is None or budget.simulated or budget.device_total <= 0:
            return None
        fraction = pool_fraction(budget.bytes, budget.device_total)
        name = FRACTION_VARS[0] if os.environ.get(FRACTION_VARS[0]) else FRACTION_VARS[1]
        other = FRACTION_VARS[1] if name == FRACTION_VARS[0] else FRACTION_VARS[0]
        os.environ.pop(other, None)  # both set is an error in current jaxlib
        os.environ[name] = fraction
        pool = int(float(fraction) * budget.device_total)
        _planned.update(
            var=name,
            note=f"pool capped at {format_size(pool)} ({name}={fraction} of "
            f"{format_size(budget.device_total)}; {format_size(OVERHEAD)} kept for context)",
        )
        return None

    def cuda_initialized(self) -> bool:
        return _backend_started(gpu_only=True)

    def apply(self, budget: Budget) -> str:
        notes = []
        if budget.bytes is None:
            notes.append("growth only, no cap")
        elif budget.simulated:
            notes.append("no cap on a simulated device")
        elif "note" in _planned:
            notes.append(_planned["note"])
        prealloc = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "")
        notes.insert(0, f"preallocation {'off' if prealloc.lower() in ('false', '0') else 'on'}")
        if _backend_started(gpu_only=False):
            report = (
                "jax: the backend had already started before memgov's budget arrived (claim "
                "before the first jax operation, or set MEMGOV_CLAIM); NOT applied to this "
                "process: " + ", ".join(notes)
            )
            log.warning("memgov: %s", report)
            return report
        return "jax: " + ", ".join(notes) + " (read when the backend starts)"


def pool_fraction(budget: int, total: int) -> str:
    """(budget - OVERHEAD) / total, rounded down to 6 decimals so the pool never exceeds it."""
    fraction = max(MIN_FRACTION, (budget - OVERHEAD) / total)
    return f"{math.floor(min(1.0, fraction) * 1e6) / 1e6:.6f}"


def _backend_started(gpu_only: bool) -> bool:
    xla_bridge = sys.modules.get("jax._src.xla_bridge")  # loaded by `import jax` (private)
    if xla_bridge is None:
        return False
    if not xla_bridge.backends_are_initialized():
        return False
    if not gpu_only:
        return True
    backends = getattr(xla_bridge, "_backends", {})  # private; without it, assume a GPU started
    return not backends or any(name in ("cuda", "rocm", "gpu") for name in backends)
