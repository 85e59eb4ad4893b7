"""Where a governed job's start-up goes when 25 start at once: memgov's claim against hand-tuning.

    python3 benchmarks/gpu/startup_burst.py [--n 25] [--rounds 2] [--out DIR]

Each burst launches N copies of a tiny torch program at once (import torch, one tensor on the
GPU) and stamps, per process, seconds from its launch to: torch imported (memgov's claim runs
inside that import), the first tensor on the GPU (the CUDA context), and its CPU seconds. The
conditions are scripts_checks' hand_mps_cap (OMP_NUM_THREADS=1, torch's allocator capped, an
MPS daemon started by hand) and memgov_mps (MEMGOV_CLAIM only, `memgov mps start`), alternated;
with --steps, a last governed burst times memgov's steps (STEPS) in each process by the main
thread's CPU clock and the wall; with --profile, a last burst of each runs under cProfile (wall
time; every thread), summed into OUT/startup_burst_profile.txt. The 25 are
CPU-bound while they start (16 cores): what memgov's start costs shows there. Raw JSON:
OUT/startup_burst.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scripts_checks as sc
import threads_checks as tc
from bench import summed_profiles

PROFILED = """
import cProfile, runpy, sys
profile = cProfile.Profile()  # wall time: Python 3.12's profiler sees every thread
profile.enable()
try:
    runpy.run_path(sys.argv[2], run_name="__main__")
finally:
    profile.disable()
    profile.dump_stats(sys.argv[1])
"""
"""The program under cProfile, its profile written where the first argument says."""

STEPS = (
    "memgov._autoenable._govern",
    "memgov._claim.claim",
    "memgov._claim._sizing",
    "memgov._gpu.enforce.decide",
    "memgov._gpu.mpsctl.servers_all_ours",
    "memgov._ledger.admission.admit",
    "memgov._ledger.ledger.DeviceLedger.read",
    "memgov._ledger.ledger.DeviceLedger.scan",
    "memgov._ledger.ledger.DeviceLedger.add",
    "memgov._claim._settle",
    "memgov._claim._govern_or_release",
    "memgov._cpu.threads.govern",
    "memgov._adapters.govern",
    "memgov._runs.start",
    "memgov._profiles.store.collect",
    "memgov._autoenable._print_reports",
    "memgov._gpu.nvml.processes",
    "memgov._gpu.nvml.devices",
    "memgov._files.trust.walk",
    "memgov_torch._cap",
    "memgov_torch.own_device_memory",
)
"""memgov's steps a --steps burst times in each governed process: the main thread's CPU
seconds and the wall seconds inside each (nested steps count in their callers too)."""

TIMED = """
import importlib, json, os, threading, time
_MAIN = threading.main_thread()
_STEPS = {}


def _wrap(dotted):
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr)
        inner = getattr(owner, parts[-1])

        def timed(*args, __inner=inner, __name=dotted, **kwargs):
            if threading.current_thread() is not _MAIN:
                return __inner(*args, **kwargs)
            cpu, wall = time.thread_time(), time.monotonic()
            try:
                return __inner(*args, **kwargs)
            finally:
                got = _STEPS.setdefault(__name, [0, 0.0, 0.0])
                got[0] += 1
                got[1] += time.thread_time() - cpu
                got[2] += time.monotonic() - wall

        setattr(owner, parts[-1], timed)
        return


for _dotted in STEPS:
    try:
        _wrap(_dotted)
    except Exception as exc:
        _STEPS[_dotted] = repr(exc)
"""


PROGRAM = """
import json, os, sys, time
launched = float(os.environ["BURST_LAUNCHED"])
import torch
imported = time.time()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
ready = time.time()
print(json.dumps({"import_s": imported - launched, "cuda_s": ready - launched,
                  "cpu_s": sum(os.times()[:2]), "steps": globals().get("_STEPS")}), flush=True)
"""


def burst(
    n: int, env: dict[str, str], work: Path, profile: Path | None, steps: bool = False
) -> dict[str, Any]:
    program = work / "program.py"
    program.write_text(f"STEPS = {STEPS!r}\n{TIMED}{PROGRAM}" if steps else PROGRAM)
    procs = []
    for index in range(n):
        argv = [sys.executable, str(program)]
        if profile is not None:
            argv = [sys.executable, "-c", PROFILED, str(profile / f"{index}.prof"), str(program)]
        child = {**env, "BURST_LAUNCHED": repr(time.time())}
        procs.append(
            subprocess.Popen(argv, env=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    jobs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        line = out.decode().strip().splitlines()[-1:] or ["{}"]
        jobs.append({"rc": proc.returncode, **json.loads(line[0]), "err": err.decode()[-600:]})
    done = [j for j in jobs if j["rc"] == 0 and "cuda_s" in j]

    def med(key: str) -> float | None:
        return round(statistics.median(j[key] for j in done), 3) if done else None

    return {
        "ok": len(done),
        "n": n,
        "import_s_median": med("import_s"),
        "cuda_s_median": med("cuda_s"),
        "cpu_s_median": med("cpu_s"),
        "cuda_s_max": round(max(j["cuda_s"] for j in done), 3) if done else None,
        "jobs": jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--steps", action="store_true", help="time memgov's steps (STEPS)")
    parser.add_argument("--profile", action="store_true", help="a cProfiled burst of each")
    parser.add_argument(
        "--before",
        type=Path,
        help="a folder with an earlier tree's memgov/ and adapters/: a third condition, "
        "memgov_mps_before, governed by that copy (first on PYTHONPATH)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import pynvml

    pynvml.nvmlInit()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    pynvml.nvmlShutdown()
    runs = []
    order = ["hand_mps_cap", "memgov_mps"] + (["memgov_mps_before"] if args.before else [])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = {**os.environ, "MEMGOV_DIR": str(work / "ledger")}
        for rnd in range(args.rounds):
            for name in order if rnd % 2 == 0 else order[::-1]:
                cond = condition(name, total, args.before)
                hand: dict[str, Any] = {}
                with tc.mps_for(cond, base, work, hand) as env:
                    got = burst(args.n, {**env, **cond["env"]}, work, None)
                runs.append({"condition": name, "round": rnd + 1, **got})
                print(name, rnd + 1, {k: v for k, v in got.items() if k != "jobs"}, flush=True)
                save(args.out, runs)  # after every burst: a call cut short keeps what ran
        if args.steps:
            cond = sc.condition("memgov_mps", "2GiB", total)
            with tc.mps_for(cond, base, work, {}) as env:
                got = burst(args.n, {**env, **cond["env"]}, work, None, steps=True)
            got["steps_median"] = steps_median(got["jobs"])
            runs.append({"condition": "memgov_mps", "round": "steps", **got})
            print("steps (calls, main-thread CPU s, wall s; medians):", flush=True)
            for name, values in got["steps_median"].items():
                print(f"  {name} {values}", flush=True)
        if not args.profile:
            save(args.out, runs)
            return
        text = ""
        for name in order:
            profiles = work / f"profiles-{name}"
            profiles.mkdir()
            cond = sc.condition(name, "2GiB", total)
            with tc.mps_for(cond, base, work, {}) as env:
                got = burst(args.n, {**env, **cond["env"]}, work, profiles)
            runs.append({"condition": name, "round": "profiled", **got})
            files = sorted(profiles.glob("*.prof"))
            text += summed_profiles(files, f"{name} processes, summed", top=70)
            # memgov's own share apart from torch's import around it (NVML's calls included)
            pattern = "memgov|adapters|pynvml"
            text += summed_profiles(files, f"{name} processes, {pattern} only", only=pattern)
        (args.out / "startup_burst_profile.txt").write_text(text)
    save(args.out, runs)


def condition(name: str, total: int, before: Path | None) -> dict[str, Any]:
    """scripts_checks' condition, or memgov_mps governed by the copy in ``before``."""
    if name != "memgov_mps_before":
        return sc.condition(name, "2GiB", total)
    assert before is not None
    cond = sc.condition("memgov_mps", "2GiB", total)
    cond["env"] = {**cond["env"], "PYTHONPATH": str(before.resolve())}
    return cond


def steps_median(jobs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per step: medians over the processes of [calls, main-thread CPU s, wall s]."""
    out: dict[str, list[float]] = {}
    for name in STEPS:
        found = [(j.get("steps") or {}).get(name) for j in jobs]
        rows = [r for r in found if isinstance(r, list)]
        if rows:
            out[name] = [round(statistics.median(r[i] for r in rows), 4) for i in range(3)]
    return out


def save(out: Path, runs: list[dict[str, Any]]) -> None:
    (out / "startup_burst.json").write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
