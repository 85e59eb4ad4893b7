"""A governed job for the profile tests: claims ``auto`` (or SIZE), uses MiB of memory, then
holds or ends as told. One JSON object per stdout line.

    python job.py MIB [--size SIZE] [--job NAME] [--hold stdin|SECONDS] [--end ok|oom|error]

On a simulated GPU memgov measures the process's peak resident memory (VmHWM), so MIB of host
memory touched here is what its profile records. ``--end oom`` runs out of memory for real:
the address space is limited (RLIMIT_AS) and a larger allocation raises MemoryError.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys

import memgov


def say(event: str, **data: object) -> None:
    os.write(sys.stdout.fileno(), (json.dumps({"event": event, **data}) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mib", type=int)
    parser.add_argument("--size", default="auto")
    parser.add_argument("--job", default=None)
    parser.add_argument("--hold", default="0")
    parser.add_argument("--end", choices=("ok", "oom", "error"), default="ok")
    parser.add_argument("--seed", default=None)  # volatile: not part of the job's identity
    args = parser.parse_args()
    claim = memgov.claim(args.size, job=args.job)
    say(
        "claimed",
        bytes=claim.bytes,
        sized=claim.sized,
        job=claim.job,
        line=claim.reports.get("auto"),
        notes=claim.reports.get("profile"),
    )
    used = bytearray(args.mib * 2**20)
    for i in range(0, len(used), 4096):
        used[i] = 1
    say("used", mib=args.mib)
    if args.hold == "stdin":
        sys.stdin.readline()
    elif float(args.hold):
        import time

        time.sleep(float(args.hold))
    say("ending", bytes=claim.bytes, give_back=claim.reports.get("give-back"))
    if args.end == "oom":
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/status") as status:
            size = next(int(ln.split()[1]) for ln in status if ln.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + 64 * 2**20, hard))
        bytearray(512 * 2**20)  # MemoryError: out of memory, uncaught
    if args.end == "error":
        raise RuntimeError("the job failed (not memory)")


if __name__ == "__main__":
    main()
