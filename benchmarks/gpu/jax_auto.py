"""N default JAX MNIST trainers vs N with MEMGOV_CLAIM=1GiB, no code change.

Runs on the GPU machine (needs a GPU, jax with CUDA, pynvml, and memgov installed into the same
Python so that its memgov-autoenable.pth is in site-packages):

    pip install --no-deps --no-build-isolation -e .
    python benchmarks/gpu/jax_auto.py --jobs 25 --epochs 1 "$OUT/jax_auto.json"

Phase "default": N copies of experiments/mnist/train_jax.py started together with JAX's own
defaults (75 % preallocation). Phase "governed": the same N with only MEMGOV_CLAIM=1GiB (and a
private ledger) in their environment. A sampler thread reads NVML every 0.25 s: each job's
footprint (per PID) and the device's total use. Each job's epoch times come from its JSON lines
(`{"event": "epoch", "seconds": ...}`); memgov's own lines come from its stderr. Each phase is
cut at --phase-timeout seconds (default 75), so N=25, --epochs 1 ends within 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TRAINER_DIR = REPO / "experiments" / "mnist"
sys.path.insert(0, str(REPO / "benchmarks" / "common"))
from nvml import FootprintSampler  # noqa: E402

MIB = 2**20
STRIPPED = ("MEMGOV_", "XLA_", "TF_FORCE_GPU_ALLOW_GROWTH", "JAX_PLATFORMS", "CUDA_MPS_")


def check_setup() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return "pynvml is not installed"
    try:
        from memgov import _autoenable
    except ImportError:
        return "memgov is not importable: pip install --no-deps --no-build-isolation -e ."
    if not _autoenable.installed_pth():
        return (
            f"{_autoenable.PTH_NAME} is not in this Python's site-packages ({sys.executable}): "
            "pip install --no-deps --no-build-isolation -e ."
        )
    names = {e.name for e in metadata.entry_points(group="memgov.adapters")}
    if "jax" not in names:
        return f"memgov's jax adapter is not registered (adapters: {sorted(names)}): reinstall"
    return None


def child_env(governed: bool, claim: str, ledger: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED)}
    if governed:
        env.update(MEMGOV_CLAIM=claim, MEMGOV_DIR=ledger)
    return env


def parse_job(index: int, proc: subprocess.Popen[str], out: str, err: str) -> dict[str, Any]:
    events = []
    for line in out.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_kind.setdefault(event.get("event", "?"), []).append(event)
    done = (by_kind.get("done") or [{}])[-1]
    error = (by_kind.get("error") or [None])[-1]
    return {
        "job": index,
        "pid": proc.pid,
        "returncode": proc.returncode,
        "ok": proc.returncode == 0 and bool(by_kind.get("done")),
        "epoch_seconds": [e.get("seconds") for e in by_kind.get("epoch", [])],
        "samples_per_s": [e.get("samples_per_s") for e in by_kind.get("epoch", [])],
        "peak_allocator_mib": done.get("peak_allocator_mib"),
        "test_acc": done.get("test_acc"),
        "error": error,
        "memgov_lines": [x for x in err.splitlines() if x.startswith("memgov:")],
        "stderr_tail": err.splitlines()[-5:] if proc.returncode else [],
    }


def phase(
    name: str, args: argparse.Namespace, ledger: str, sampler: FootprintSampler
) -> dict[str, Any]:
    env = child_env(name == "governed", args.claim, ledger)
    command = [
        sys.executable,
        "train_jax.py",
        "--epochs",
        str(args.epochs),
        "--device",
        args.device,
    ]
    command += args.trainer_args.split()
    sampler.peaks.clear()
    start = time.monotonic()
    sampler_mark = len(sampler.timeline)
    procs = []
    with tempfile.TemporaryDirectory(prefix=f"jax-auto-{name}-") as tmp:
        logs = []
        for i in range(args.jobs):
            out = open(Path(tmp, f"{i}.out"), "w+")  # noqa: SIM115 (closed below)
            err = open(Path(tmp, f"{i}.err"), "w+")  # noqa: SIM115
            logs.append((out, err))
            procs.append(
                subprocess.Popen(
                    command,
                    cwd=TRAINER_DIR,
                    env=env,
                    stdout=out,
                    stderr=err,
                    text=True,
                    start_new_session=True,
                )
            )
        deadline = start + args.phase_timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        elapsed = time.monotonic() - start
        jobs = []
        for i, (proc, (out, err)) in enumerate(zip(procs, logs, strict=True)):
            out.seek(0), err.seek(0)
            job = parse_job(i, proc, out.read(), err.read())
            job["peak_nvml_mib"] = round(sampler.peaks.get(proc.pid, 0) / MIB, 1)
            jobs.append(job)
            out.close(), err.close()
    ok = [j for j in jobs if j["ok"]]
    epochs = [s for j in ok for s in j["epoch_seconds"] if s is not None]
    rates = [j["samples_per_s"][-1] for j in ok if j["samples_per_s"]]
    timeline = sampler.timeline[sampler_mark:]
    return {
        "phase": name,
        "env": {k: env[k] for k in ("MEMGOV_CLAIM",) if k in env},
        "jobs_started": len(jobs),
        "jobs_ok": len(ok),
        "wall_s": round(elapsed, 1),
        "peak_device_used_mib": max((t[1] for t in timeline), default=None),
        "footprint_mib_ok_jobs": sorted(j["peak_nvml_mib"] for j in ok),
        "epoch_seconds_ok_jobs": sorted(epochs),
        "aggregate_samples_per_s_last_epoch": round(sum(r for r in rates if r), 1),
        "errors": sorted({(j["error"] or {}).get("kind", "none") for j in jobs if not j["ok"]}),
        "jobs": jobs,
        "timeline": timeline,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON results file")
    parser.add_argument("--jobs", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--claim", default="1GiB")
    parser.add_argument("--phase-timeout", type=float, default=75.0)
    parser.add_argument("--phases", default="default,governed")
    parser.add_argument(
        "--device", choices=("gpu", "cpu"), default="gpu", help="cpu: a dry run without NVML"
    )
    parser.add_argument("--trainer-args", default="", help='e.g. "--limit 512" for a dry run')
    args = parser.parse_args()
    problem = check_setup()
    if problem:
        sys.exit(f"jax_auto: {problem}")
    sampler = FootprintSampler(0 if args.device == "gpu" else None, period_s=0.25)
    sampler.__enter__()
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "device": sampler.device(),
        "versions": {d: metadata.version(d) for d in ("jax", "jaxlib", "memgov")},
        "jobs": args.jobs,
        "epochs": args.epochs,
        "claim": args.claim,
        "phases": [],
    }
    with tempfile.TemporaryDirectory(prefix="jax-auto-ledger-") as ledger:
        for name in args.phases.split(","):
            idle = time.monotonic() + 20
            while sampler.used_mib() > 1024 and time.monotonic() < idle:
                time.sleep(0.5)  # let the previous phase's memory return to the driver
            data = phase(name, args, ledger, sampler)
            result["phases"].append(data)
            print(
                f"{name}: {data['jobs_ok']}/{data['jobs_started']} ok in {data['wall_s']} s, "
                f"device peak {data['peak_device_used_mib']} MiB, footprints "
                f"{data['footprint_mib_ok_jobs'][:3]}..., epoch s "
                f"{data['epoch_seconds_ok_jobs'][:3]}..., errors {data['errors']}",
                flush=True,
            )
    sampler.__exit__()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
