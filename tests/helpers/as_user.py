"""Run one ledger action as another user: python as_user.py UID gc|unlink PATH|claim SIZE.

Prints one JSON object. Starts as root and drops to UID first (see claimer.become).
"""

from __future__ import annotations

import json
import os
import sys

from claimer import become

import memgov
from memgov import _status


def main() -> None:
    uid, action, *args = sys.argv[1:]
    become(int(uid))
    if action == "gc":
        snap = _status.snapshots(clean=True)[0]
        print(
            json.dumps(
                {"removed": snap.removed, "problems": snap.problems, "claimed": snap.claimed}
            )
        )
    elif action == "unlink":
        try:
            os.unlink(args[0])
            print(json.dumps({"error": None}))
        except OSError as exc:
            print(json.dumps({"error": type(exc).__name__}))
    elif action == "claim":
        try:
            memgov.claim(args[0]).release()
            print(json.dumps({"error": None}))
        except memgov.MemgovError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    else:
        raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    main()
