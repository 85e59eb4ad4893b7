"""One compilation cache for a pack's jobs, warmed by one job before the others start.

N copies of a JAX job compile the same programs. Started together on a shared host they all
compile at once: on an H200 host (16 cores) 25 JAX MNIST jobs spent 28-39 s in their first epoch
(XLA compilation and GPU autotuning, 25 at a time) against ~1 s for each epoch after it
(results/h200/2026-11-23-threads-jax.json.gz). So for frameworks with a persistent compilation
cache (an adapter's ``Facts.compile_cache_dir``: JAX's) pack gives the governed jobs of a pack
one cache folder and, before a run's jobs start, runs a **warm-up job**: the run's first job
(same command, arguments and environment) until its ``start`` report, then stops it. A trainer
that compiles before it reports ``start`` (experiments/mnist's JAX trainer does: ``prepare``) has
then put every program of the run in the cache, and the run's jobs load them instead of compiling
them. The warm-up is skipped when an earlier run of the same pack (the solo job) already reached
``start`` with the cache.

JAX reads the cache settings from the environment (jax.config's names, upper case; its adapter's
facts list them):

- ``JAX_COMPILATION_CACHE_DIR``: the folder;
- ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`` and ``..._MIN_ENTRY_SIZE_BYTES=-1``: every
  program is kept (by default only those that took >= 1 s to compile);
- ``JAX_COMPILATION_CACHE_MAX_SIZE``: a bound, 4 GiB. With a bound JAX takes a file
  lock around every read and write of the cache (jax/_src/lru_cache.py); without one it writes
  an entry in place, unlocked, so a job could read another job's half-written entry.
XLA's GPU autotuning results go to the same folder (``jax_persistent_cache_enable_xla_caches``,
whose default is XLA's per-fusion autotune cache, written by rename).

JAX treats the cache as trusted: whoever can write in the folder can run code in the jobs. So
``--compile-cache auto`` makes a new folder inside the report folder (or uses
``JAX_COMPILATION_CACHE_DIR`` when pack's own environment sets one: the user's choice wins), and
``--compile-cache DIR`` refuses a folder that is not the user's own or that others may write.
``--compile-cache off``: no cache and no warm-up.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import stat
import time
from pathlib import Path
from typing import Any

from memgov._base.errors import ConfigError
from memgov.pack.jobs import Job, JobSpec
from memgov.pack.runners import Runner

WARM_UP_TIMEOUT_S = 600.0
"""The longest a warm-up job may take to report ``start`` (--timeout, when shorter, wins)."""
STOP_GRACE_S = 10.0
CHOICES = "auto (a folder in the report folder), off, or a folder of your own"


def cache_folder(choice: str, framework: str, out: Path) -> tuple[Path | None, str]:
    """(the cache folder or None, why) for ``--compile-cache``; creates the folder."""
    text = choice.strip()
    if text.lower() == "off":
        return None, "--compile-cache off"
    from memgov import _adapters

    cached = {
        name: f.compile_cache_dir for name, f in _adapters.facts().items() if f.compile_cache_dir
    }
    variable = cached.get(framework)
    if variable is None:
        shared = ", ".join(cached)
        return None, f"no compilation cache pack can share for {framework} (only {shared})"
    if text.lower() == "auto":
        own = os.environ.get(variable, "").strip()
        if own:
            return _checked(Path(own), variable), f"{variable} from pack's environment"
        return _checked(out / "compile-cache", "--compile-cache auto"), (
            "--compile-cache auto: a new folder in the report folder"
        )
    return _checked(Path(text).expanduser(), "--compile-cache"), f"--compile-cache {text}"


def _checked(folder: Path, what: str) -> Path:
    """Create ``folder`` (mode 0700 where new) and refuse one that others could write in."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError as exc:
        raise ConfigError(
            f"{what} {folder}: cannot create the cache folder "
            f"({exc.strerror or exc}); accepted {CHOICES}"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {folder}: not a folder; accepted {CHOICES}")
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # JAX runs what it finds there: a folder others can write is code others can run.
        raise ConfigError(
            f"{what} {folder}: the folder must be yours and writable by you alone (JAX runs the "
            f"programs it finds in its compilation cache); accepted {CHOICES}"
        )
    return folder.resolve()


def cache_env(folder: Path, framework: str) -> dict[str, str]:
    """The variables that give a job of ``framework`` the shared cache."""
    from memgov import _adapters

    facts = _adapters.facts()[framework]
    assert facts.compile_cache_dir is not None  # cache_folder() gave a folder
    return {facts.compile_cache_dir: str(folder), **facts.compile_cache_env}


def warm_up(
    spec: JobSpec,
    runner: Runner,
    cwd: Path,
    base_env: dict[str, str],
    log_dir: Path,
    timeout: float | None,
) -> dict[str, Any]:
    """Run ``spec`` until its ``start`` report (or its end, or ``timeout``), then stop it.

    Returns what happened: ``status`` (``warm``: it reported start; ``ended``: it ended first;
    ``timeout``), the seconds, and the start report's ``prepared`` details (compile seconds,
    cache hits and misses) where the trainer gives them. Ctrl-C stops the job too."""
    limit = min(timeout or WARM_UP_TIMEOUT_S, WARM_UP_TIMEOUT_S)
    inbox: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
    job = Job(spec)
    t0 = time.monotonic()
    status = "timeout"
    try:
        job.start(runner, cwd, base_env, log_dir, inbox, t0)
        deadline = t0 + limit
        while time.monotonic() < deadline:
            try:
                kind, _label, data = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if kind == "exit":
                status = "ended"
                break
            if data.get("event") == "start":
                status = "warm"
                break
    finally:
        seconds = time.monotonic() - t0
        job.stop(runner, "warm-up")
        with contextlib.suppress(KeyboardInterrupt, SystemExit):
            if not job.wait_ended(STOP_GRACE_S):
                job.stop(runner, "warm-up", signal.SIGKILL)
                job.wait_ended(5.0)
    start = job.first("start") or {}
    error = job.first("error") or {}
    return {
        "status": status,
        "s": round(seconds, 3),
        "stopped_s": round(time.monotonic() - t0, 3),
        "prepared": start.get("prepared"),
        "error": error.get("message") if status == "ended" else None,
        "log": str(job.log) if job.log else None,
    }
