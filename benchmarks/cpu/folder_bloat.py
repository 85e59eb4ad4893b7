"""What a flood that is gone still costs: a claims folder that once held many files.

    python benchmarks/cpu/folder_bloat.py [--flood N] [--present N] [--rounds N] [--json PATH]

Three claims folders, each in a fresh ledger on one simulated 16 GiB device and each holding
PRESENT empty record-named files (a flood's current wave): "fresh" (never held more),
"bloated" (FLOOD files planted and removed first: the folder's blocks stay on ext4 and xfs),
"rebuilt" (a bloated one after `memgov gc`, which rebuilds it: memgov/_ledger/compact.py). In ROUNDS
rounds, the three in turn: one listing (os.listdir, as every scan does; median of 200) and one
record written as memgov writes one (a 0600 file created, filled, renamed into place, then
removed; median of 200). Prints the folder sizes and each figure's median over the rounds. No
GPU is needed; run it as any user.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STATES = ("fresh", "bloated", "rebuilt")
PAYLOAD = b"x" * 300  # about a claim record's size


def plant(folder: Path, count: int, tag: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(count):
            name = f"{i:020d}-{tag}{i % 4096:08x}.json"
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def make(base: Path, state: str, flood: int, present: int) -> Path:
    """The claims folder of a new ledger in ``state``."""
    env = {**os.environ, "MEMGOV_DIR": str(base / state), "MEMGOV_DEVICES": "sim0:16GiB"}
    run = [sys.executable, "-c", "import memgov; memgov.claim('1GiB').release()"]
    subprocess.run(run, env=env, check=True, capture_output=True)  # the ledger's folders
    claims = base / state / "v1" / "sim0" / "claims"
    if state != "fresh":
        plant(claims, flood, "f0")
        for name in os.listdir(claims):  # the flood goes; the folder's room does not
            os.unlink(claims / name)
    if state == "rebuilt":
        gc = [sys.executable, "-m", "memgov", "gc"]
        subprocess.run(gc, env=env, check=True, capture_output=True)
    plant(claims, present, "a0")
    return claims


def median_ms(step: Any, times: int = 200) -> float:
    took = []
    for i in range(times):
        began = time.perf_counter()
        step(i)
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1e3


def one_round(claims: Path) -> dict[str, float]:
    fd = os.open(claims, os.O_RDONLY | os.O_DIRECTORY)
    try:

        def write(i: int) -> None:
            tmp, name = f".tmp-bench-{i}", f"{time.time_ns():020d}-{i:012x}.json"
            file = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd)
            os.write(file, PAYLOAD)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            os.close(file)
            os.unlink(name, dir_fd=fd)

        return {
            "listing_ms": median_ms(lambda _i: os.listdir(fd)),
            "record_write_ms": median_ms(write),
        }
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flood", type=int, default=100_000)
    p.add_argument("--present", type=int, default=2_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="memgov-bloat-"))
    try:
        folders = {state: make(base, state, args.flood, args.present) for state in STATES}
        rounds: dict[str, list[dict[str, float]]] = {state: [] for state in STATES}
        for _ in range(args.rounds):
            for state in STATES:
                rounds[state].append(one_round(folders[state]))
        summary = {
            state: {
                "folder_bytes": os.stat(folders[state]).st_size,
                "names": len(os.listdir(folders[state])),
                **{
                    key: round(statistics.median(r[key] for r in rounds[state]), 3)
                    for key in ("listing_ms", "record_write_ms")
                },
            }
            for state in STATES
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for state, figures in summary.items():
        print(state, figures)
    if args.json:
        report = {
            "machine": f"{platform.node()} ({os.cpu_count()} cores)",
            "python": platform.python_version(),
            "command": " ".join(sys.argv),
            "summary": summary,
            "rounds": rounds,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
