"""One claimer's claim() beside another user's flood of dead files, cold and warm.

    sudo python benchmarks/cpu/claim_beside_flood.py [--files 10000] [--cycles 20] [--profile N]

Run as root. A root-made ledger (`memgov gc`: the admin set-up) on one simulated 16 GiB device;
uid 54322 owns FILES empty record-named files in claims/ and FILES in v1/cpu/ (what a flood
leaves between two runs of root's gc). A process of uid 54321 then claims 1 GiB and releases
it: the first claim (a new process: nothing known yet) and the median and largest of CYCLES more.
Prints one JSON line; with --profile N, the N costliest functions of the claimer (cProfile).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLAIMER, FLOODER = 54321, 54322

CHILD = r"""
import cProfile, io, json, os, pstats, sys, time
import memgov
from memgov import _adapters, _claim, _runs, _status  # noqa: F401
from memgov._profiles import store as _profiles  # noqa: F401
from memgov._cpu import threads as _threads  # noqa: F401
_adapters.available()
os.setgroups([]); os.setgid(CLAIMER); os.setuid(CLAIMER)
cycles, top = int(sys.argv[1]), int(sys.argv[2])
profile = cProfile.Profile()
profile.enable()
start = time.perf_counter()
memgov.claim("1GiB", wait=5).release()
first = time.perf_counter() - start
warm = []
for _ in range(cycles):
    start = time.perf_counter()
    memgov.claim("1GiB", wait=5).release()
    warm.append(time.perf_counter() - start)
profile.disable()
warm.sort()
print(json.dumps({"first_ms": round(first * 1000, 1),
                  "warm_median_ms": round(warm[len(warm) // 2] * 1000, 2),
                  "warm_max_ms": round(warm[-1] * 1000, 2)}))
if top:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(top)
    print(out.getvalue())
""".replace("CLAIMER", str(CLAIMER))


def plant(folder: Path, count: int, tag: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        for i in range(count):
            name = f"{time.time_ns():020d}-{abs(hash((tag, i))) % 16**12:012x}.json"
            made = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=fd)
            os.fchown(made, FLOODER, FLOODER)
            os.close(made)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--profile", type=int, default=0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the claimer and the flood have uids of their own")
    base = Path(tempfile.mkdtemp(prefix="memgov-flood-", dir="/tmp"))
    base.chmod(0o755)
    ledger = base / "ledger"
    env = {**os.environ, "MEMGOV_DIR": str(ledger), "MEMGOV_DEVICES": "sim0:16GiB"}
    try:
        subprocess.run([sys.executable, "-m", "memgov", "gc"], env=env, check=True)
        plant(ledger / "v1" / "sim0" / "claims", args.files, "claims")
        plant(ledger / "v1" / "cpu", args.files, "cpu")
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.cycles), str(args.profile)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        lines = done.stdout.splitlines()
        print(json.dumps({"files_per_folder": args.files, **json.loads(lines[0])}))
        print("\n".join(lines[1:]))
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    main()
