"""What a pack is asked to do (:class:`PackConfig`), checked, and the environment of its jobs.

Modes:
- ``greedy``: frameworks at their defaults, no memgov variable at all, no thread or MPS
  governance; it reproduces the study (and is the naive baseline).
- ``growth``: ``MEMGOV_CLAIM=growth``: no budget, no greedy preallocation, threads governed.
- ``claim``: ``MEMGOV_CLAIM=<bytes>``: a budget per job on the ledger (hard under MPS), threads
  governed. Jobs run with ``MEMGOV_STRICT=1``: a refused claim stops the job with BudgetExceeded
  instead of letting it run ungoverned.

Fast by default: each governed job gets its share of the CPU from memgov's thread budget
(memgov/_threads.py: usable cores / governed processes on them, followed as jobs come and go),
the same mechanism as any governed process, because N jobs with one thread per core each spin
against each other (docs/pack.md: 8 torch jobs, 3,129 samples/s at framework defaults against 21,987
for one job alone). ``--threads N`` fixes it (``MEMGOV_THREADS=N``).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from memgov import _settings, _threads
from memgov._errors import ConfigError
from memgov._sizes import parse_size
from memgov.pack.runners import DOCKER_IMAGE, RUNNER_CHOICES

MODES = ("greedy", "growth", "claim")
MPS_CHOICES = ("auto", "on", "off")
DEVICES = ("gpu", "cpu")
BASELINES = ("none", "naive")
GiB = 2**30
DEFAULT_CLAIM = {"torch": GiB, "jax": 3 * GiB // 2, "tensorflow": 3 * GiB // 2}
"""``--claim auto`` with no history yet. torch: 884 MiB measured per MNIST job on an H200 (whole
process, context included); JAX 890-901 MiB without preallocation, TensorFlow 1,205 MiB on an RTX
3090 (the project's survey, docs/adapters.md), so 1.5 GiB for both, whose allocators hold more
slack."""
DEFAULT_CLAIM_OTHER = GiB
MAX_JOBS = 1024

THREAD_VARS = _threads.ENV_VARS
GOVERNANCE_VARS = _settings.names(job=True)
"""The settings decided for each governed process (memgov's settings table): pack sets them per
mode, never passing on its own environment's."""
FRAMEWORK_DEFAULT_VARS = (
    *THREAD_VARS, "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR", "TF_FORCE_GPU_ALLOW_GROWTH",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
)
"""Removed in greedy mode, so the frameworks really run at their defaults."""
BUDGET_PREFIXES = (*_settings.TRIGGERS, "CUDA_MPS_")
"""Variables that wake auto-enable or steer MPS: greedy drops them all; the other modes drop
CUDA_MPS_* (pack decides MPS itself)."""


@dataclass
class PackConfig:
    experiment: str | Path
    n: int = 2
    sweep: list[int] | None = None
    framework: str = "torch"
    mode: str = "claim"
    claim: str = "auto"
    mps: str = "auto"
    mps_daemons: int | None = None
    """MPS control daemons to run; None: as many as the jobs at once need (48 clients each)."""
    epochs: int | None = None
    batch: int | None = None
    runner: str = "auto"
    image: str = DOCKER_IMAGE
    out: Path | None = None
    device: str = "gpu"
    gpu: str | None = None
    threads: int | None = None
    """CPU threads per job (MEMGOV_THREADS); None: memgov's thread budget decides in each job
    (expected: max(1, cores // jobs running at once))."""
    parallel: int | None = None
    """Jobs running at once; None: all (under MPS at most its client limit, the rest queue)."""
    baseline: str = "none"
    baseline_args: list[str] = field(default_factory=list)
    solo: bool = True
    rogue: tuple[int, int] | None = None
    timeout: float | None = None
    wait: float | None = None
    pin: bool = False
    history: bool = True
    host_per_job: str = "auto"
    """Host memory one job needs: SIZE, auto (recorded peaks) or off (see hostmem.py)."""
    compile_cache: str = "auto"
    """One compilation cache for the governed jobs, warmed by one job first: auto, off or a
    folder (see warmup.py; JAX only)."""
    python: str = sys.executable
    trainer_args: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Raise ConfigError for anything pack cannot do, before any job starts."""
        _choice("--mode", self.mode, MODES)
        _choice("--mps", self.mps, MPS_CHOICES)
        _choice("--device", self.device, DEVICES)
        _choice("--runner", self.runner, RUNNER_CHOICES)
        _choice("--baseline", self.baseline, BASELINES)
        _count("--n", self.n, MAX_JOBS)
        for name, value in (("--epochs", self.epochs), ("--batch", self.batch),
                            ("--threads", self.threads), ("--parallel", self.parallel)):
            if value is not None:
                _count(name, value, 10**6)
        if self.mps_daemons is not None:
            _count("--mps-daemons", self.mps_daemons, 16)
        if self.sweep is not None:
            if not self.sweep:
                raise ConfigError("--sweep: accepted a comma-separated list of job counts, "
                                  "e.g. 1,8,25")
            for n in self.sweep:
                _count("--sweep", n, MAX_JOBS)
            if self.baseline != "none":
                raise ConfigError("--baseline applies to a single --n, not to --sweep")
        if self.host_per_job.strip().lower() not in ("auto", "off"):
            try:
                parse_size(self.host_per_job, what="--host-per-job")
            except ValueError as exc:
                raise ConfigError(f"{exc}; or auto (recorded host peaks) or off") from None
        if self.mode != "claim" and self.claim != "auto":
            raise ConfigError(f"--claim {self.claim} applies to --mode claim only "
                              f"(--mode {self.mode} claims no budget)")
        if self.mode == "greedy" and self.mps == "on":
            raise ConfigError("--mode greedy runs the frameworks at their defaults, without MPS; "
                              "accepted with it: --mps auto or off")
        if self.device == "cpu" and self.mps == "on":
            raise ConfigError("--mps on needs a GPU; with --device cpu accepted: --mps auto/off")
        if self.device == "gpu" and _settings.is_set("MEMGOV_DEVICES"):
            raise ConfigError("MEMGOV_DEVICES simulates GPUs, but --device gpu needs real ones: "
                              "unset MEMGOV_DEVICES, or pack on CPU with --device cpu")
        if self.rogue is not None:
            count, mib = self.rogue
            largest = max(self.sweep or [self.n])
            if not 1 <= count <= largest or mib < 1:
                raise ConfigError(f"--rogue {count}:{mib}: accepted K:MIB with 1 <= K <= {largest}"
                                  " jobs and MIB >= 1")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"--timeout {self.timeout}: accepted seconds > 0")
        _settings.wait_seconds(self.wait, "--wait")  # the rule of MEMGOV_WAIT, which it sets
        if self.baseline_args and self.baseline == "none":
            raise ConfigError("--baseline-args needs --baseline naive")
        if self.runner != "docker":  # docker jobs run the image's python
            check_python(self.python)


def check_python(python: str) -> None:
    """Refuse an interpreter that cannot start, before any job or report exists."""
    found = shutil.which(python) if os.sep not in python else python
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        if found is None:
            where = "not found on PATH"
        elif not os.path.exists(found):
            where = "no such file"
        else:
            where = "not an executable file"
        raise ConfigError(f"--python {python!r}: {where}; accepted the path (or a name on PATH)"
                          " of a Python interpreter that has the experiment's framework")


def report_folder(out: Path) -> Path:
    """Make the report folder (and its parents); a clear error where that cannot be done."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--out {out}: a file of that name is in the way; accepted a folder "
                          "path (it is created if missing)") from None
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the report folder "
                          f"({exc.strerror or exc}); accepted a folder you can write") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: the folder is not writable; accepted a folder you can "
                          "write")
    return out


def _choice(name: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ConfigError(f"{name} {value!r}: accepted {', '.join(accepted)}")


def _count(name: str, value: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ConfigError(f"{name} {value!r}: accepted a whole number from 1 to {most}")


def parse_sweep(text: str) -> list[int]:
    items = [t.strip() for t in text.split(",")]
    if not items or not all(t.isdigit() and int(t) >= 1 for t in items):
        raise ConfigError(f"--sweep {text!r}: accepted comma-separated job counts >= 1, "
                          "e.g. 1,8,25,48")
    return [int(t) for t in items]


def parse_rogue(text: str) -> tuple[int, int]:
    count, sep, mib = text.partition(":")
    if not sep or not count.strip().isdigit() or not mib.strip().isdigit():
        raise ConfigError(f"--rogue {text!r}: accepted K:MIB, e.g. 1:4096 (the last K jobs "
                          "also allocate MIB MiB on the GPU after their first step)")
    return int(count), int(mib)


def cores() -> int:
    return len(os.sched_getaffinity(0))


def threads_for(cfg: PackConfig, concurrent: int) -> int:
    return cfg.threads or max(1, cores() // max(1, concurrent))


def cpu_sets(index: int, threads: int) -> set[int]:
    """The cores job ``index`` is pinned to with --pin: consecutive blocks, wrapping around."""
    allowed = sorted(os.sched_getaffinity(0))
    start = (index * threads) % len(allowed)
    return {allowed[(start + k) % len(allowed)] for k in range(min(threads, len(allowed)))}


def base_env(mode: str) -> dict[str, str]:
    """pack's environment minus what pack decides per mode."""
    env = dict(os.environ)
    for name in list(env):
        # Thread variables of pack's own environment are pack's, not a choice for its jobs:
        # governed jobs get memgov's share (or --threads N), greedy ones the defaults.
        decided = (name in GOVERNANCE_VARS or name in THREAD_VARS
                   or name.startswith("CUDA_MPS_"))
        default = mode == "greedy" and (name in FRAMEWORK_DEFAULT_VARS
                                        or name.startswith(BUDGET_PREFIXES))
        if decided or default:
            del env[name]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def job_env(*, mode: str, claim_bytes: int | None, threads: int | None, ledger: Path,
            device_uuid: str | None, simulated: str | None, mps_pipe: Path | None,
            mps_log: Path | None, wait: float | None) -> dict[str, str]:
    """The variables pack sets for one job (on top of :func:`base_env`)."""
    env = {"MEMGOV_DIR": str(ledger)}
    if device_uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = device_uuid  # one card, also for greedy jobs
    if mode == "greedy":
        return env
    if simulated is not None:
        env["MEMGOV_DEVICES"] = simulated
    env["MEMGOV_CLAIM"] = "growth" if mode == "growth" else str(claim_bytes)
    env["MEMGOV_STRICT"] = "1"
    if threads is not None:
        env["MEMGOV_THREADS"] = str(threads)  # the job's memgov sets the thread variables
    if wait is not None:
        env["MEMGOV_WAIT"] = f"{wait:g}"
    if mps_pipe is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps_pipe)
        if mps_log is not None:
            env["CUDA_MPS_LOG_DIRECTORY"] = str(mps_log)
        if "MEMGOV_MPS_POLICY" not in os.environ:
            # A job that starts as another ends (waves) joins the daemon with the most room: an
            # MPS server still counts a client that has released its claim while its CUDA
            # context is torn down, and with `fill` the new job met that full server (2 of 140
            # jobs failed on the H200, docs/pack.md).
            env["MEMGOV_MPS_POLICY"] = "spread"
    else:
        env["MEMGOV_MPS"] = "off"
    return env
