"""Forks in a governed process while another thread scans the ledger: how many children hold a
descriptor in the ledger, and what the child's at-fork hook costs.

    python benchmarks/cpu/fork_strays.py [--forks 300] [--fds 60] [--tree PATH]

A claim on a simulated GPU, a thread reading the CPU shares back to back (the thread follower's
work without its pauses: a folder walked, listed, every record probed), and the main thread
forking ``--forks`` children, each of which counts its descriptors under the ledger folder and
exits. Then, in one process with ``--fds`` more descriptors open, the mean time of the part of
the hook that looks for descriptors no registered object owns (memgov/_files/flock.py), where that
code has it. ``--tree`` puts another checkout's memgov first on the path (to compare with
main's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Also the program of tests/core/test_fork_moments.py's race test (200 forks).
RACE = """
import os, sys, threading
import memgov
from memgov._base import config as _config
from memgov._cpu import share as _cpushare

claim = memgov.claim("1GiB")
real = os.path.realpath(_config.ledger_dir())
stop = threading.Event()

def scan():  # the thread follower's work, without its pauses
    while not stop.is_set():
        _cpushare.peers(clean=False)

def ledger_fds():
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        found += target == real or target.startswith(real + "/")
    return found

threading.Thread(target=scan, daemon=True).start()
holding = 0
for _ in range(int(sys.argv[1])):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, bytes([min(ledger_fds(), 255)]))
        os._exit(0)
    os.close(w)
    holding += os.read(r, 1)[0] > 0
    os.close(r)
    os.waitpid(pid, 0)
stop.set()
claim.release()
print(holding)
"""
WHERE = "import memgov; print(memgov.__file__)"
HOOK = """
import os, sys, time
import memgov
from memgov._files import flock as _flock

claim = memgov.claim("1GiB")
extra = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[1]))]
hook = getattr(_flock, "_blank_strays_in_child", None)
if hook is None:
    print("none", len(os.listdir("/proc/self/fd")))
else:
    began = time.perf_counter()
    for _ in range(200):
        hook()
    print(round((time.perf_counter() - began) / 200 * 1e6), len(os.listdir("/proc/self/fd")))
claim.release()
"""


def run(program: str, arg: int, tree: Path | None) -> str:
    with tempfile.TemporaryDirectory(prefix="memgov-forks-") as ledger:
        return _run(program, arg, tree, ledger)


def _run(program: str, arg: int, tree: Path | None, ledger: str) -> str:
    env = {
        **os.environ,
        "MEMGOV_DIR": ledger,
        "MEMGOV_DEVICES": "sim0:16GiB",
        "MEMGOV_QUIET": "1",
        "PYTHONPATH": os.pathsep.join(str(p) for p in (tree, ROOT) if p is not None),
    }
    done = subprocess.run(
        [sys.executable, "-c", program, str(arg)],
        env=env,
        cwd=tempfile.gettempdir(),  # `-c` puts the working folder first on the path
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--forks", type=int, default=300)
    p.add_argument("--fds", type=int, default=60)
    p.add_argument("--tree", type=Path, help="another checkout whose memgov goes first")
    args = p.parse_args()
    if args.forks < 1 or args.fds < 0:
        p.error("--forks: accepted a whole number >= 1; --fds: a whole number >= 0")
    print(f"memgov from {run(WHERE, 0, args.tree)}")
    holding = run(RACE, args.forks, args.tree)
    print(f"children holding a ledger descriptor: {holding} of {args.forks}")
    micros, open_fds = run(HOOK, args.fds, args.tree).split()
    cost = "this memgov has none" if micros == "none" else f"{micros} us a fork"
    print(f"the hook's search for stray descriptors, {open_fds} open: {cost}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
