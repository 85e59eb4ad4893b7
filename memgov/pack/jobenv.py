"""The environment of a pack's job: one builder for ``memgov pack`` and ``memgov ray pack``.

A job's environment is what it inherits (:func:`inherited`: the starting process's environment
minus everything pack decides) and what pack decides (:func:`decided`, from a :class:`JobEnv`).
The trainers never import memgov themselves: these variables are all the governance they get,
read by auto-enable at their framework's import (docs/auto-enable.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from memgov import _adapters
from memgov._base import settings as _settings
from memgov._cpu import threads as _threads

THREAD_VARS = _threads.ENV_VARS
GOVERNANCE_VARS = _settings.names(job=True)
"""The settings decided for each governed process (memgov's settings table): pack sets them per
mode, never passing on its own environment's."""
BUDGET_PREFIXES = (*_settings.TRIGGERS, "CUDA_MPS_")
"""Variables that wake auto-enable or steer MPS: greedy drops them all; the other modes drop
CUDA_MPS_* (pack decides MPS itself)."""
MPS_OF_THE_NODE = "node"
"""``JobEnv.mps`` for a job that uses whatever MPS its machine offers (a Ray node's)."""


@dataclass(frozen=True)
class JobEnv:
    """What pack decides for one job's environment."""

    mode: str
    """greedy (no memgov variable at all), growth or claim."""
    claim: str | None = None
    """MEMGOV_CLAIM in claim mode: bytes, a size or auto."""
    threads: int | None = None
    """MEMGOV_THREADS (the job's memgov sets the thread variables); None: its thread budget."""
    wait: float | None = None
    ledger: Path | None = None
    """MEMGOV_DIR; None: the job's own (a Ray node's)."""
    visible: str | None = None
    """CUDA_VISIBLE_DEVICES: the one card of a local pack (greedy jobs too)."""
    device: str | None = None
    """MEMGOV_DEVICE: the GPU to claim on, where it is not the only visible one."""
    simulated: str | None = None
    """MEMGOV_DEVICES: pack's own simulated GPU (a CPU pack)."""
    mps_pipe: Path | None = None
    mps_log: Path | None = None
    mps: str = "off"
    """Without a pipe: ``off`` (MEMGOV_MPS=off) or :data:`MPS_OF_THE_NODE`."""


def inherited(
    mode: str, environ: Mapping[str, str] | None = None, *, keep_mps: bool = False
) -> dict[str, str]:
    """``environ`` (default: this process's) minus what pack decides for ``mode``; ``keep_mps``
    keeps the CUDA_MPS_* variables of a job that uses its machine's MPS."""
    env = dict(os.environ if environ is None else environ)
    # Removed in greedy mode, so the frameworks really run at their defaults: the thread
    # variables and each framework's own (its adapter's facts).
    defaults = {*THREAD_VARS, *(v for f in _adapters.facts().values() for v in f.env)}
    for name in list(env):
        # Thread variables of pack's own environment are pack's, not a choice for its jobs:
        # governed jobs get memgov's share (or --threads N), greedy ones the defaults.
        mps = name.startswith("CUDA_MPS_") and not keep_mps
        decided = name in GOVERNANCE_VARS or name in THREAD_VARS or mps
        default = mode == "greedy" and (name in defaults or name.startswith(BUDGET_PREFIXES))
        if decided or default:
            del env[name]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def decided(job: JobEnv) -> dict[str, str]:
    """The variables pack sets for one job (on top of :func:`inherited`)."""
    env = {} if job.ledger is None else {"MEMGOV_DIR": str(job.ledger)}
    if job.visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = job.visible  # one card, also for greedy jobs
    if job.mode == "greedy":
        return env
    if job.simulated is not None:
        env["MEMGOV_DEVICES"] = job.simulated
    if job.device is not None:
        env["MEMGOV_DEVICE"] = job.device
    env["MEMGOV_CLAIM"] = "growth" if job.mode == "growth" else str(job.claim)
    env["MEMGOV_STRICT"] = "1"
    if job.threads is not None:
        env["MEMGOV_THREADS"] = str(job.threads)  # the job's memgov sets the thread variables
    if job.wait is not None:
        env["MEMGOV_WAIT"] = f"{job.wait:g}"
    env.update(_mps(job))
    return env


def _mps(job: JobEnv) -> dict[str, str]:
    if job.mps_pipe is None:
        return {"MEMGOV_MPS": "off"} if job.mps == "off" else {}
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(job.mps_pipe)}
    if job.mps_log is not None:
        env["CUDA_MPS_LOG_DIRECTORY"] = str(job.mps_log)
    if "MEMGOV_MPS_POLICY" not in os.environ:
        # A job that starts as another ends (waves) joins the daemon with the most room: an
        # MPS server still counts a client that has released its claim while its CUDA
        # context is torn down, and with `fill` the new job met that full server (2 of 140
        # jobs failed on the H200, docs/pack.md).
        env["MEMGOV_MPS_POLICY"] = "spread"
    return env
