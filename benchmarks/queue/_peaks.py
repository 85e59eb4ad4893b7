"""Run a script as ``python SCRIPT ARGS...`` would, and print torch's peak memory at exit.

Only size_kinds.py uses it, to read torch's allocator peaks from scripts it must not change (the
PyTorch examples); the queue's mixes run the scripts directly.

    python _peaks.py SCRIPT [ARGS...]   -> last line: QUEUE_SIZING_PEAKS {"peak_allocated_mib": ...}
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys

MARK = "QUEUE_SIZING_PEAKS"


def report() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        print(MARK, json.dumps({"peak_allocated_mib": None, "peak_reserved_mib": None}))
        return
    mib = 2**20
    print(
        MARK,
        json.dumps(
            {
                "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / mib, 1),
                "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / mib, 1),
            }
        ),
        flush=True,
    )


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: _peaks.py SCRIPT [ARGS...]")
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)
    atexit.register(report)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
