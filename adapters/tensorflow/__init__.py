"""memgov's TensorFlow adapter: memory growth, or a memory cap, set before TF initialises its GPUs.

TensorFlow takes almost the whole card by default. Its two remedies both raise RuntimeError once
the runtime has initialised its GPUs (the first op does that), so memgov applies them right
after ``import tensorflow``, from an import hook:

- growth mode (no budget): ``tf.config.experimental.set_memory_growth(gpu, True)`` on every GPU,
  plus ``TF_FORCE_GPU_ALLOW_GROWTH=true`` for the C++ runtime;
- cap mode (a budget): one logical device on the claimed GPU with ``memory_limit`` = budget minus
  :data:`OVERHEAD`, the CUDA context and libraries that live outside TF's allocator. (TF cannot
  combine a memory limit with the Python growth setting on one device; the environment variable
  still makes the capped pool grow on demand instead of being taken at once.)

If TensorFlow was initialised before the budget arrived, the report says what was not applied.

Not verified on GPU hardware: TensorFlow cannot run on this project's GPU machines
(docs/adapters.md). The GPU branch is tested against a stand-in for ``tf.config``; the CPU
import path with the real tensorflow-cpu.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from memgov.adapter import Budget, Facts, format_size

OVERHEAD = 600 * 2**20
"""Device memory outside TF's allocator (CUDA context, cuDNN, cuBLAS). Not measured for TF here;
measured 612-650 MiB for torch and ~700 MiB for JAX on an H200 (docs/adapters.md)."""
MIN_LIMIT_MIB = 1

log = logging.getLogger("memgov")


class TensorFlowAdapter:
    name = "tensorflow"
    module = "tensorflow"
    facts = Facts(
        distributions=("tensorflow", "tensorflow-cpu"),
        env=("TF_FORCE_GPU_ALLOW_GROWTH", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"),
        greedy_env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"},
        # 1,205 MiB per MNIST job on an RTX 3090 (the project's survey); its allocator holds
        # more slack. Not forkable: its jemalloc thread runs through fork (docs/pack.md).
        default_claim=3 * 2**30 // 2,
        extra="tensorflow",
    )

    def configure_env(self, budget: Budget) -> str | None:
        # Read by TF's C++ allocator when it starts; setdefault keeps an explicit choice.
        os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
        return None

    def cuda_initialized(self) -> bool:
        return _runtime_initialized()

    def apply(self, budget: Budget) -> str:
        import tensorflow as tf  # already imported: apply runs from its import hook

        report = configure(tf.config, budget, initialized=_runtime_initialized())
        if "NOT applied" in report or "already initialised" in report:
            log.warning("memgov: %s", report)
        return report


def _runtime_initialized() -> bool:
    """Whether TF's eager context exists (its GPUs are set up then, and can no longer change)."""
    # Private, but the only way to ask. Not imported here: mid-import of tensorflow it may not
    # exist yet, and then TF cannot have been initialised either.
    context = sys.modules.get("tensorflow.python.eager.context")
    try:
        return context is not None and context.context()._context_handle is not None
    except Exception:
        return False


def configure(config: Any, budget: Budget, initialized: bool) -> str:
    """Apply ``budget`` through ``config`` (``tf.config``, or a stand-in in tests); a report."""
    applied: list[str] = []
    missed: list[str] = []
    if budget.threads:
        (missed if initialized else applied).append(_threads(config, budget.threads, initialized))
    try:
        gpus = list(config.list_physical_devices("GPU"))
    except Exception as exc:  # a broken CUDA install: say so, do not fail the program
        gpus = []
        missed.append(f"GPU list unavailable ({type(exc).__name__}: {exc})")
    if not gpus:
        applied.append("no GPU visible to TensorFlow, no GPU memory setting needed")
    elif initialized:
        missed.append(_wanted(budget, gpus))
    else:
        try:
            applied.append(_gpu_settings(config, budget, gpus))
        except RuntimeError as exc:  # initialised between our check and the call
            missed.append(f"{_wanted(budget, gpus)} ({exc})")
    return _report(applied, missed, initialized)


def _threads(config: Any, threads: int, initialized: bool) -> str:
    what = f"{threads} intra-op and inter-op thread(s)"
    if initialized:
        return what
    # The user's own setting before the claim wins (0 is TF's "not set: all cores").
    chosen = [
        config.threading.get_intra_op_parallelism_threads(),
        config.threading.get_inter_op_parallelism_threads(),
    ]
    if any(isinstance(n, int) and n > 0 for n in chosen):
        return f"intra-op/inter-op threads {chosen[0]}/{chosen[1]} set by the user: kept"
    config.threading.set_intra_op_parallelism_threads(threads)
    config.threading.set_inter_op_parallelism_threads(threads)
    return what


def _gpu_settings(config: Any, budget: Budget, gpus: list[Any]) -> str:
    if budget.bytes is None or budget.simulated or budget.device_index is None:
        for gpu in gpus:
            config.experimental.set_memory_growth(gpu, True)
        why = "growth only" if budget.bytes is None else "no cap on a simulated device"
        return f"memory growth on {len(gpus)} GPU(s) ({why})"
    index = budget.device_index if budget.device_index < len(gpus) else 0
    limit_mib = max(MIN_LIMIT_MIB, (budget.bytes - OVERHEAD) // 2**20)
    config.set_logical_device_configuration(
        gpus[index], [config.LogicalDeviceConfiguration(memory_limit=limit_mib)]
    )
    note = (
        f"GPU:{index} capped at {limit_mib} MiB ({format_size(budget.bytes)} budget, "
        f"{format_size(OVERHEAD)} kept for context and libraries)"
    )
    if len(gpus) > 1:
        # TF ignores growth settings once any GPU has a logical configuration.
        note += f"; {len(gpus) - 1} other visible GPU(s) not governed"
    return note


def _wanted(budget: Budget, gpus: list[Any]) -> str:
    if budget.bytes is None or budget.simulated:
        return f"memory growth on {len(gpus)} GPU(s)"
    return f"memory cap from the {format_size(budget.bytes)} budget"


def _report(applied: list[str], missed: list[str], initialized: bool) -> str:
    parts = []
    if initialized:
        parts.append(
            "TensorFlow was already initialised before memgov's budget arrived (claim before "
            "the first TensorFlow operation, or set MEMGOV_CLAIM)"
        )
    if applied:
        parts.append("applied: " + ", ".join(applied))
    if missed:
        parts.append("NOT applied: " + ", ".join(missed))
    return "tensorflow: " + "; ".join(parts)
