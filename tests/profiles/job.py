"""A governed job for the profile tests: claims ``auto`` (or SIZE), uses MiB of memory, then
holds or ends as told. One JSON object per stdout line.

    python job.py MIB [--size SIZE] [--job NAME] [--hold stdin|SECONDS] [--end ok|oom|error]
                      [--capped] [--start-at PATH] [--wait SECONDS]

On a simulated GPU memgov measures the process's peak resident memory (VmHWM), so MIB of host
memory touched here is what its profile records. ``--end oom`` runs out of memory for real:
the address space is limited (RLIMIT_AS) and a larger allocation raises MemoryError.
``--capped``: the MIB are touched 16 MiB at a time under the claim as a capped allocator (torch's
under memgov) holds them: the allocation that would pass the claim raises MemoryError, the job's
own OOM. ``--start-at PATH``: claim only once PATH exists (many processes claim at once);
``--wait``: queue that long for room; ``--size from-env``: the size MEMGOV_CLAIM gives (what
the job queue passes).
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
    parser.add_argument("--capped", action="store_true")
    parser.add_argument("--start-at", default=None)
    parser.add_argument("--wait", type=float, default=None)
    args = parser.parse_args()
    if args.start_at:
        import time

        while not os.path.exists(args.start_at):
            time.sleep(0.02)
    size = os.environ["MEMGOV_CLAIM"] if args.size == "from-env" else args.size  # the queue's
    claim = memgov.claim(size, job=args.job, wait=args.wait)
    say(
        "claimed",
        bytes=claim.bytes,
        sized=claim.sized,
        job=claim.job,
        line=claim.reports.get("auto"),
        notes=claim.reports.get("profile"),
    )
    if args.capped:
        chunks: list[bytearray] = []
        for _ in range(0, args.mib, 16):
            if (len(chunks) + 1) * 16 * 2**20 > claim.bytes:
                say("oom", bytes=claim.bytes, held_mib=len(chunks) * 16)
                raise MemoryError(f"tried to allocate 16 MiB past the claim of {claim.bytes}")
            chunk = bytearray(16 * 2**20)
            for i in range(0, len(chunk), 4096):
                chunk[i] = 1
            chunks.append(chunk)
    else:
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
