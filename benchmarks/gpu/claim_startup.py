"""Where a governed process's start-up goes, against the same process hand-tuned (GPU machine).

    python3 benchmarks/gpu/claim_startup.py [--n 1 25] [--rounds 2] --out DIR

Under one MPS daemon (`memgov mps start`, private folders), N processes start at once in each
condition, rounds alternating the order:
  hand     OMP_NUM_THREADS=1: `import torch`, then a first CUDA tensor
  memgov   MEMGOV_CLAIM=1GiB (auto-enable claims at interpreter start): the same
  nvml     `import pynvml; nvmlInit()` alone (what the claim's device discovery starts with)
Each process reports, from its launch: the interpreter up (auto-enable's claim included where
governed), `import torch` done, the first CUDA tensor done; nvml: nvmlInit's own seconds.
Printed: medians and maxima per condition and N; raw per-process figures in DIR/claim_startup.json.
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

CHILD = r"""
import json, os, sys, time
up = time.time()
launch = float(os.environ["STARTUP_LAUNCH"])
if os.environ["STARTUP_KIND"] == "nvml":
    import pynvml
    t = time.time(); pynvml.nvmlInit(); init = time.time() - t
    print(json.dumps({"up_s": up - launch, "nvml_init_s": init}))
    sys.exit(0)
import torch
imported = time.time()
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
cuda = time.time()
print(json.dumps({"up_s": up - launch, "torch_s": imported - launch, "cuda_s": cuda - launch,
                  "threads": torch.get_num_threads()}))
"""


def wave(kind: str, n: int, env: dict[str, str]) -> list[dict[str, float]]:
    procs = []
    for _ in range(n):
        e = dict(env, STARTUP_KIND=kind, STARTUP_LAUNCH=repr(time.time()))
        child = [sys.executable, "-c", CHILD]
        procs.append(subprocess.Popen(child, env=e, stdout=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=300)
        line = (text.strip().splitlines() or ["{}"])[-1]
        try:
            out.append(dict(json.loads(line), rc=p.returncode))
        except ValueError:
            out.append({"rc": p.returncode, "bad": text[-300:]})
    return out


def condition_env(kind: str, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if kind == "memgov":
        env["MEMGOV_CLAIM"] = "1GiB"
    else:
        env.pop("MEMGOV_CLAIM", None)
        env["OMP_NUM_THREADS"] = "1"
    return env


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    got: dict[str, float] = {"ok": sum(1 for r in rows if r.get("rc") == 0)}
    for key in ("up_s", "torch_s", "cuda_s", "nvml_init_s"):
        values = [r[key] for r in rows if key in r]
        if values:
            got[key + "_median"] = round(statistics.median(values), 3)
            got[key + "_max"] = round(max(values), 3)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 25])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ledger = tempfile.mkdtemp(prefix="memgov-startup-")
    base = dict(os.environ, MEMGOV_DIR=ledger, PYTHONUNBUFFERED="1")
    start = subprocess.run(
        [sys.executable, "-m", "memgov", "mps", "start"], env=base, capture_output=True, text=True
    )
    print("memgov mps start rc", start.returncode, start.stderr.strip()[-300:])
    runs = []
    try:
        for round_no in range(args.rounds):
            kinds = ["hand", "memgov", "nvml"]
            if round_no % 2:
                kinds.reverse()
            for n in args.n:
                for kind in kinds:
                    rows = wave(kind, n, condition_env(kind, base))
                    runs.append({"round": round_no + 1, "n": n, "kind": kind, "rows": rows})
                    print(round_no + 1, f"n={n}", kind, json.dumps(summary(rows)), flush=True)
    finally:
        stop_cmd = [sys.executable, "-m", "memgov", "mps", "stop"]
        stop = subprocess.run(stop_cmd, env=base, capture_output=True, text=True)
        print("memgov mps stop rc", stop.returncode)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "claim_startup.json").write_text(json.dumps({"runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
