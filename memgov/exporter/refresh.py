"""The body that `memgov exporter` serves, prepared ahead of the scrapes by one refresher thread.

A scrape only sends the latest prepared bytes (memgov/exporter/serve.py); reading the ledger and
NVML and writing the exposition text happen here, in a thread of their own, so what a scrape costs
depends neither on the number of holders nor on how long NVML takes on a busy GPU. The refresher
runs once at start, then every ``interval`` seconds, and at once when the ledger changes:

- a holder visible from here (same PID namespace, or the exporter on the host) dies: each one is
  watched with a pidfd, which the kernel makes readable when the process exits, after its files
  (and so its record's flock) are closed; no polling of the records;
- a record is added to or removed from a device's ``claims/`` or ``queue/`` folder: the folder's
  change time is looked at every ``CHECK_S`` (one lstat each).

A refresh for a change starts at once, or, when refreshes follow each other (a pack's jobs
ending one after another), once the refresher has rested as long as its last refresh took: a
stream of changes keeps it busy half the time at most. So a killed holder's series is gone from
the first body refreshed after its death, which starts at once (or after that rest) for a visible
holder; within CHECK_S for a new claim; within ``interval`` for a holder in a PID namespace the
exporter cannot see. The thread keeps the CPU priority of the process: a lower one (nice) would
make it slower to hand the GIL back to a scrape's thread on a saturated host, where a preempted
holder of the GIL holds up every other thread, and would leave the body far older there
(docs/metrics.md, "Scrape time and memory").
"""

from __future__ import annotations

import contextlib
import gzip
import os
import select
import threading
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from memgov._gpu import nvml as _nvml
from memgov._ledger.ledger import DeviceLedger
from memgov.exporter.families import MemgovCollector
from memgov.exporter.model import Reading

CHECK_S = 0.25
"""How often the ledger folders' change times are looked at between refreshes."""
RACY_NS = 50_000_000
"""A folder changed this recently before its lstat may change again within the same timestamp
tick (file times are coarse): it counts as changed once more at the next check."""
MAX_WATCHED = 1000
"""At most this many holders are watched with a pidfd (one descriptor each); the others' deaths
are seen at the next interval or folder change."""


@dataclass(frozen=True)
class Body:
    """One prepared exposition: what every scrape until the next refresh is answered with."""

    text: bytes
    gzipped: bytes
    started: float
    """Unix time at which the refresh that made it began."""


Signature = tuple[int, int, int] | None


class Refresher:
    """Makes a new Body at start, every ``interval`` seconds and when the ledger changes."""

    def __init__(
        self,
        interval: float,
        collector: MemgovCollector | None = None,
        release_nvml: bool = False,
    ) -> None:
        self.interval = interval
        self.release_nvml = release_nvml
        self.collector = collector or MemgovCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.body = self._make("start")
        self._finished = time.monotonic()
        self._stop = threading.Event()
        self._watched: dict[tuple[str, str], int] = {}
        self._exited: set[tuple[str, str]] = set()
        """Claims whose watched process exited while the claim lives on (a child forked with
        its lock keeps it): not watched again, or every wait would end at once."""
        self._folders: dict[str, Signature] = {}
        self._racy = False
        self._watch(self.collector.last_reading)
        self._thread = threading.Thread(target=self._run, name="memgov-refresh", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
        for fd in self._watched.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._watched.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            reason = self._wait()
            if reason is None:
                return
            self.refresh(reason)

    def refresh(self, reason: str) -> None:
        """Make a new body now (the refresher's thread; --textfile's loop, which has none)."""
        self.body = self._make(reason)
        self._watch(self.collector.last_reading)
        self._finished = time.monotonic()

    def _make(self, reason: str) -> Body:
        begun = time.monotonic()
        self.collector.refreshes[reason] += 1
        started = time.time()
        text = generate_latest(self.registry)
        body = Body(text, gzip.compress(text, compresslevel=1), started)
        if self.release_nvml:
            _nvml.shutdown()
        _give_back_freed_memory()
        self.collector.previous_seconds = time.monotonic() - begun
        return body

    # -- what starts a refresh -----------------------------------------------------------------
    def _wait(self) -> str | None:
        """Block until the next refresh is due: "interval", "change", or None when stopped."""
        reason = self._next()
        if reason == "change":
            # Holders that die one after another (a pack's jobs ending) must not keep the
            # refresher busy: it rests at least as long as its last refresh took.
            rest = self.collector.previous_seconds - (time.monotonic() - self._finished)
            if rest > 0 and self._stop.wait(rest):
                return None
        return reason

    def _next(self) -> str | None:
        deadline = time.monotonic() + self.interval
        poller = select.poll()
        for fd in self._watched.values():
            poller.register(fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "interval"
            step = min(CHECK_S, left)
            if self._watched:
                if poller.poll(step * 1000):  # a watched holder exited
                    return "change"
                if self._stop.is_set():
                    return None
            elif self._stop.wait(step):
                return None
            if self._folders_changed():
                return "change"

    def _watch(self, reading: Reading | None) -> None:
        """Watch the holders of ``reading`` with pidfds (kept across refreshes while their claim
        lives) and note the ledger folders' change times as they are now."""
        self._folders, self._racy = _folder_signatures(reading)
        live: dict[tuple[str, str], int | None] = {}
        for gpu in reading.gpus if reading is not None else []:
            for claim in gpu.claims:
                live[(claim.entry.record, claim.entry.id)] = claim.holder.host_pid
        for key, fd in list(self._watched.items()):
            if key not in live or _exited(fd):
                os.close(self._watched.pop(key))
                if key in live:
                    self._exited.add(key)
        self._exited &= set(live)
        for key, pid in live.items():
            known = key in self._watched or key in self._exited
            if known or pid is None or len(self._watched) >= MAX_WATCHED:
                continue
            try:
                self._watched[key] = os.pidfd_open(pid)
            except ProcessLookupError:
                self._racy = True  # died since the scan: refresh at the next check
            except (OSError, AttributeError):  # no pidfds (Linux < 5.3), or out of descriptors
                break

    def _folders_changed(self) -> bool:
        if self._racy:
            return True
        return any(_signature(path) != seen for path, seen in self._folders.items())


def _give_back_freed_memory() -> None:
    """Return the free pages inside malloc's heap to the system (glibc's malloc_trim): what the
    imports and each refresh freed (and, with ``release_nvml``, NVML's state) stays resident
    until reused otherwise. ctypes costs 0.25 MiB here; the first trim gives back 0.6 MiB
    (docs/metrics.md, "Memory")."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc: musl has no malloc_trim
        ctypes.CDLL(None).malloc_trim(0)


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _folder_signatures(reading: Reading | None) -> tuple[dict[str, Signature], bool]:
    """Each device's claims/ and queue/ folder -> (inode, mtime, ctime); and whether one changed
    so recently that a change within the same timestamp tick could go unseen."""
    found: dict[str, Signature] = {}
    now = time.time_ns()
    racy = False
    for gpu in reading.gpus if reading is not None else []:
        for section in ("claims", "queue"):
            path = str(DeviceLedger(gpu.device).path / section)
            found[path] = seen = _signature(path)
            racy = racy or (seen is not None and now - max(seen[1], seen[2]) < RACY_NS)
    return found, racy


def _signature(path: str) -> Signature:
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_ctime_ns


__all__ = ["CHECK_S", "Body", "Refresher"]
