"""Run inside a container: hold a claim, then try to alter every other holder's record.

    python holder.py NAME SIZE STAGE_DIR

1. claims SIZE on the first (simulated) device as NAME and writes STAGE_DIR/NAME.claimed (JSON:
   uid, record, pid);
2. when STAGE_DIR/go-NAME appears, tries, on every record in the claims folder that is not its own:
   unlink, open for writing, rename a file of its own over it, chmod, and take its lock; writes
   what happened to STAGE_DIR/NAME.tamper (JSON);
3. waits for STAGE_DIR/end (also without a go), releases and exits 0.
Only the standard library and memgov (the image's).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from pathlib import Path

import memgov


def _wait_for(path: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"{path} never appeared")
        time.sleep(0.1)


def _try(action, *args) -> str:
    try:
        action(*args)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "done"


def _lock(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def _open_write(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND))


def main() -> None:
    name, size, stage = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    held = memgov.claim(size, name=name)
    ledger = Path(os.environ["MEMGOV_DIR"]) / "v1" / held.device / "claims"
    mine = held.record
    (stage / f"{name}.claimed").write_text(
        json.dumps(
            {"uid": os.getuid(), "pid": os.getpid(), "record": mine, "host": os.uname().nodename}
        )
    )
    while not (stage / f"go-{name}").exists():
        if (stage / "end").exists():
            held.release()
            return
        time.sleep(0.1)
    results = {}
    decoy = stage / f"{name}.decoy"
    for path in sorted(ledger.glob("*.json")):
        if path.name == mine:
            continue
        decoy.write_text("{}")
        results[path.name] = {
            "unlink": _try(os.unlink, path),
            "open_for_write": _try(_open_write, path),
            "rename_over": _try(os.rename, decoy, path),
            "chmod": _try(os.chmod, path, 0o666),
            "lock_exclusive": _try(_lock, path),
        }
    (stage / f"{name}.tamper").write_text(json.dumps({"uid": os.getuid(), "results": results}))
    _wait_for(stage / "end")
    held.release()


if __name__ == "__main__":
    main()
