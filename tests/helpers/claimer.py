"""A child process that claims a budget and reports, one JSON object per stdout line.

    python claimer.py SIZE [--wait S] [--device D] [--name N] [--hold stdin|forever|SECONDS]
                           [--fork sleep|release] [--cycles K] [--user UID]

Events: {"event": "admitted", "record", "device", "pid", "pidns", "t"}, {"event": "refused",
"message"}, {"event": "error", "type", "message"}, {"event": "forked", "child"},
{"event": "child-ready", "pid"},
{"event": "released"}. With --hold stdin the claim is held until a line (or EOF) arrives on stdin.
--fork forks after admission: the child sleeps ("sleep") or leaves a `with` block that releases
its copy of the claim ("release") and then sleeps; the parent keeps holding. --user drops root
for that uid (and gid) before claiming: it plays another user of the host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import memgov
from memgov._ledger.attribution import pidns_of


def say(event: str, **data: object) -> None:
    # One write per line: a forked child shares the pipe, and a pipe write of at most PIPE_BUF
    # bytes is atomic, so lines of two processes never interleave (print() may split them).
    line = json.dumps({"event": event, "t": time.time(), **data}) + "\n"
    os.write(sys.stdout.fileno(), line.encode())


def become(uid: int) -> None:
    """Drop root for ``uid``, after loading what a claim needs (the interpreter's own files may lie
    in a folder only root can read, e.g. /root/.pyenv)."""
    import tempfile

    import filelock

    from memgov import _adapters, _claim, _status  # noqa: F401

    _adapters.available()
    with tempfile.NamedTemporaryFile() as scratch, filelock.FileLock(scratch.name + ".lock"):
        pass
    os.unlink(scratch.name + ".lock")  # filelock leaves its file: no temporary file left behind
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def hold(how: str) -> None:
    if how == "stdin":
        sys.stdin.readline()
    elif how == "forever":
        while True:
            time.sleep(3600)
    else:
        time.sleep(float(how))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("size")
    parser.add_argument("--wait", type=float, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--name", default=None)
    parser.add_argument("--hold", default="stdin")
    parser.add_argument("--fork", choices=("sleep", "release"), default=None)
    parser.add_argument("--cycles", type=int, default=1)
    parser.add_argument("--user", type=int, default=None)
    args = parser.parse_args()
    if args.user is not None:
        become(args.user)
    device: int | str | None = args.device
    if isinstance(device, str) and device.isdigit():
        device = int(device)
    for _ in range(args.cycles):
        try:
            claim = memgov.claim(args.size, wait=args.wait, device=device, name=args.name)
        except memgov.BudgetExceeded as exc:
            say("refused", message=str(exc), queued_ahead=exc.queued_ahead)
            return 3
        except Exception as exc:
            say("error", type=type(exc).__name__, message=str(exc))
            return 4
        with claim:
            say(
                "admitted",
                record=claim.record,
                device=claim.device,
                pid=os.getpid(),
                pidns=pidns_of(),
                bytes=claim.bytes,
            )
            if args.fork:
                child = os.fork()
                if child == 0:
                    # After os.fork() returned here, memgov's at-fork hook has run in this child.
                    say("child-ready", pid=os.getpid())
                    if args.fork == "release":
                        with claim:
                            pass  # the child's copy: leaving the block must not free the parent's
                        say("child-released", pid=os.getpid())
                    hold("forever")
                say("forked", child=child)
            hold(args.hold)
        say("released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
