"""What each part of the exporter's serving process adds to its memory, import by import.

    python benchmarks/cpu/exporter_import_memory.py      (MEMGOV_DEVICES and MEMGOV_DIR as for
                                                          the exporter: the last steps read them)

One fresh interpreter imports, in the order `python -m memgov.exporter` needs them, the standard
library's pieces that prometheus_client pulls in (ssl, the HTTP server and client, email),
prometheus_client, memgov's readers and the exporter, then makes one body as the exporter does
at start; before that body it tries what could give memory back: gc.collect(), and glibc's
malloc_trim(0) (which needs ctypes; the exporter trims after each refresh). Last, what the
exporter no longer imports (psutil) or imports only where NVML is used (pynvml). After each step:
RSS, anonymous memory and the number of modules, from /proc/self/smaps_rollup. Only
standard-library imports come before the first reading. Where no compiled bytecode is cached
(a read-only install, PYTHONDONTWRITEBYTECODE=1, pip's --no-compile), every module is compiled
from its source at import, which leaves the heap larger; to see that case:
PYTHONDONTWRITEBYTECODE=1 PYTHONPYCACHEPREFIX=$(mktemp -d) python benchmarks/cpu/...
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def reading() -> tuple[float, float]:
    found = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Rss:", "Anonymous:"):
                found[parts[0]] = int(parts[1]) / 1024
    return found["Rss:"], found["Anonymous:"]


def main() -> int:
    print(f"python {sys.version.split()[0]}; MiB; each step's difference from the one before")
    print(f"{'RSS':>7} {'+RSS':>6} {'anon':>7} {'+anon':>6} {'modules':>7}  step")
    last = reading()

    def step(name: str, action: Callable[[], object] | None = None) -> None:
        nonlocal last
        if action is not None:
            action()
        now = reading()
        print(
            f"{now[0]:7.2f} {now[0] - last[0]:+6.2f} {now[1]:7.2f} {now[1] - last[1]:+6.2f} "
            f"{len(sys.modules):7d}  {name}",
            flush=True,
        )
        last = now

    step("interpreter start-up (site, this script)")
    for name in ("threading", "socket", "re", "dataclasses"):
        __import__(name)
    step("threading, socket, re, dataclasses")
    step("ssl (prometheus_client.exposition imports it)", lambda: __import__("ssl"))
    for name in ("http.server", "urllib.request", "email.utils"):
        __import__(name)
    step("http.server, urllib.request, email (prometheus_client's)")
    step("prometheus_client", lambda: __import__("prometheus_client"))
    step("memgov", lambda: __import__("memgov"))
    step("memgov's readers (_status, _ledger, _stats)", lambda: __import__("memgov._status"))
    step("memgov.exporter.serve", lambda: __import__("memgov.exporter.serve"))
    import gc

    step("gc.collect()", gc.collect)
    import ctypes

    step("import ctypes")

    def trim() -> None:
        ctypes.CDLL(None).malloc_trim(0)

    step("malloc_trim(0)", trim)
    from memgov.exporter.refresh import Refresher

    refresher = Refresher(5.0)
    step(f"the first body made, as at start ({len(refresher.body.text)} bytes; it trims too)")
    step("import psutil (no longer imported by the exporter)", lambda: __import__("psutil"))
    step("import pynvml (where NVML is used)", lambda: __import__("pynvml"))
    step("malloc_trim(0) (the exporter's, after the refresh that imported pynvml)", trim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
