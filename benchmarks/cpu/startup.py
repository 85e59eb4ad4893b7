"""Interpreter start-up (`python -c pass`) with memgov installed and MEMGOV_CLAIM unset, vs without.

Builds two fresh virtual environments from the same base interpreter, identical but for memgov
(installed from a wheel of this checkout, so its memgov-autoenable.pth is in site-packages), then
times `python -c pass` in each, interleaved (A, B, A, B, ...) so that drift in the machine's load
hits both alike. memgov's dependencies are left out (--no-deps): none of them installs a .pth
file, so they cost an interpreter start-up nothing, and leaving them out isolates memgov's line.
A third series times the memgov venv with MEMGOV_CLAIM set (auto-enable's hook install).

    python benchmarks/cpu/startup.py --runs 400 --out results/cpu-2core/2026-11-21-startup.json.gz
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLEARED = ("MEMGOV_", "CUDA_DEVICE_MEMORY_LIMIT", "ALIYUN_COM_GPU_MEM", "GPU_MEMORY_LIMIT",
           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "SLURM_SHARDS_ON_NODE", "PYTHON")  # fmt: skip


def base_python() -> str:
    """The interpreter the venvs are made from (not a venv's, so both start from the same one)."""
    return os.path.join(
        sys.base_exec_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"
    )


def make_venv(path: Path) -> Path:
    subprocess.run([base_python(), "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def install_memgov(python: Path, work: Path) -> None:
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        check=True,
    )
    (wheel,) = wheels.glob("memgov-*.whl")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)


def time_once(python: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one `python -c pass`. CPU time (user + system, from wait4) is the
    steadier figure on a shared machine: other load stretches wall time, not the child's CPU."""
    start = time.perf_counter_ns()
    proc = subprocess.Popen([str(python), "-c", "pass"], env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter_ns() - start) / 1e6
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} -c pass exited with {proc.returncode}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1e3


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered),
        "mean_ms": statistics.fmean(ordered),
        "stdev_ms": statistics.stdev(ordered),
        "p05_ms": ordered[int(0.05 * (len(ordered) - 1))],
        "p95_ms": ordered[int(0.95 * (len(ordered) - 1))],
        "min_ms": ordered[0],
    }


def ratio_ci(a: list[float], b: list[float], rounds: int = 2000) -> tuple[float, float]:
    """95 % bootstrap interval of median(b) / median(a)."""
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(b, k=len(b))) / statistics.median(rng.choices(a, k=len(a)))
        for _ in range(rounds)
    )
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="runs per series (default 400)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    with tempfile.TemporaryDirectory(prefix="memgov-startup-") as tmp:
        work = Path(tmp)
        bare = make_venv(work / "without")
        governed = make_venv(work / "with")
        install_memgov(governed, work)
        pth = next((work / "with" / "lib").glob("python3*/site-packages/memgov-autoenable.pth"))
        claim_env = {**env, "MEMGOV_CLAIM": "1GiB"}
        runs = {"without": (bare, env), "with_unset": (governed, env),
                "with_claim_set": (governed, claim_env)}  # fmt: skip
        wall: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.warmup):
            for python, run_env in runs.values():
                time_once(python, run_env)
        for _ in range(args.runs):
            for name, (python, run_env) in runs.items():
                w, c = time_once(python, run_env)
                wall[name].append(w)
                cpu[name].append(c)
        pth_line = pth.read_text().strip()

    result: dict[str, object] = {
        "command": "python -c pass",
        "runs_per_series": args.runs,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average_at_end": os.getloadavg(),
        "pth_line": pth_line,
    }
    for metric, series in (("cpu", cpu), ("wall", wall)):
        base = statistics.median(series["without"])
        low, high = ratio_ci(series["without"], series["with_unset"])
        result[metric] = {
            "series": {name: summary(samples) for name, samples in series.items()},
            "ratio_with_unset_over_without": statistics.median(series["with_unset"]) / base,
            "ratio_95ci": [low, high],
            "ratio_claim_set_over_without": statistics.median(series["with_claim_set"]) / base,
            "samples_ms": series,
        }
        print(f"-- {metric} time per `python -c pass` (ms)")
        for name, stats in result[metric]["series"].items():  # type: ignore[index]
            print(
                f"{name:15s} median {stats['median_ms']:.2f}  mean {stats['mean_ms']:.2f} "
                f"+- {stats['stdev_ms']:.2f}  p05 {stats['p05_ms']:.2f}  p95 {stats['p95_ms']:.2f}"
            )
        print(
            f"ratio with memgov (MEMGOV_CLAIM unset) / without: "
            f"{statistics.median(series['with_unset']) / base:.4f} "
            f"(95% bootstrap CI {low:.4f}-{high:.4f}); with MEMGOV_CLAIM set / without: "
            f"{statistics.median(series['with_claim_set']) / base:.4f}"
        )
    print(f"load average at the end: {os.getloadavg()}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
