"""Where a governed job's start-up goes when 25 start at once: memgov's claim against hand-tuning.

    python3 benchmarks/gpu/startup_burst.py [--n 25] [--rounds 2] [--out DIR]

Each burst launches N copies of a tiny torch program at once (import torch, one tensor on the
GPU) and stamps, per process, seconds from its launch to: torch imported (memgov's claim runs
inside that import), the first tensor on the GPU (the CUDA context), and its CPU seconds. The
conditions are scripts_checks' hand_mps_cap (OMP_NUM_THREADS=1, torch's allocator capped, an
MPS daemon started by hand) and memgov_mps (MEMGOV_CLAIM only, `memgov mps start`), alternated;
a last governed burst runs under cProfile, summed into OUT/startup_burst_profile.txt. The 25 are
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

PROGRAM = """
import json, os, sys, time
launched = float(os.environ["BURST_LAUNCHED"])
import torch
imported = time.time()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
ready = time.time()
print(json.dumps({"import_s": imported - launched, "cuda_s": ready - launched,
                  "cpu_s": sum(os.times()[:2])}), flush=True)
"""


def burst(n: int, env: dict[str, str], work: Path, profile: Path | None) -> dict[str, Any]:
    program = work / "program.py"
    program.write_text(PROGRAM)
    procs = []
    for index in range(n):
        argv = [sys.executable, str(program)]
        if profile is not None:
            argv = [sys.executable, "-m", "cProfile", "-o", str(profile / f"{index}.prof")]
            argv.append(str(program))
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
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import pynvml

    pynvml.nvmlInit()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    pynvml.nvmlShutdown()
    runs = []
    order = ["hand_mps_cap", "memgov_mps"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = {**os.environ, "MEMGOV_DIR": str(work / "ledger")}
        for rnd in range(args.rounds):
            for name in order if rnd % 2 == 0 else order[::-1]:
                cond = sc.condition(name, "2GiB", total)
                hand: dict[str, Any] = {}
                with tc.mps_for(cond, base, work, hand) as env:
                    got = burst(args.n, {**env, **cond["env"]}, work, None)
                runs.append({"condition": name, "round": rnd + 1, **got})
                print(name, rnd + 1, {k: v for k, v in got.items() if k != "jobs"}, flush=True)
                save(args.out, runs)  # after every burst: a call cut short keeps what ran
        profiles = work / "profiles"
        profiles.mkdir()
        cond = sc.condition("memgov_mps", "2GiB", total)
        with tc.mps_for(cond, base, work, {}) as env:
            got = burst(args.n, {**env, **cond["env"]}, work, profiles)
        runs.append({"condition": "memgov_mps", "round": "profiled", **got})
        files = sorted(profiles.glob("*.prof"))
        text = summed_profiles(files, "governed processes, summed", top=70)
        # memgov's own share apart from torch's import around it (NVML's calls included)
        pattern = "memgov|adapters|pynvml"
        text += summed_profiles(files, f"governed processes, {pattern} only", only=pattern)
        (args.out / "startup_burst_profile.txt").write_text(text)
    save(args.out, runs)


def save(out: Path, runs: list[dict[str, Any]]) -> None:
    (out / "startup_burst.json").write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
