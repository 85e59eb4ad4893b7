"""Sampling while jobs run: NVML per-process footprints, device use, host memory, ledger claims.

NVML reports host PIDs, so the sampler runs in pack's (host) PID namespace and maps each NVML PID
to a job by walking up the process tree to the job's root: the trainer itself (process runner),
the unshare process whose grandchild the trainer is (namespace runner), or the container's first
process (docker runner, from ``docker inspect``; the job's processes are then the members of that
process's cgroup, which also holds what ``docker exec`` started). A job's footprint is the sum over
its tree.
Host memory is RSS and USS (memory only this process holds: RSS counts shared library pages in
every process). Claims are read from the ledger and matched by (PID namespace, PID in it), which
is how the ledger itself tells holders apart across namespaces.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memgov._gpu import nvml as _nvml
from memgov._gpu.devices import Device
from memgov._ledger.attribution import identity
from memgov._ledger.ledger import DeviceLedger

FAST_S = 0.2
"""NVML footprints, device use and the ledger's claims."""
SLOW_S = 1.0
"""Host memory (USS reads /proc/PID/smaps_rollup)."""


@dataclass
class JobSample:
    footprint: int | None = None
    """Peak NVML bytes of the job's processes together (None: never seen by NVML)."""
    rss: int | None = None
    uss: int | None = None
    claim_bytes: int | None = None
    claim_mode: str | None = None
    mps_daemon: int | None = None
    """The memgov MPS daemon a hard claim joined (its ledger record's ``mps_daemon``)."""
    host_pids: tuple[int, ...] = ()


class Sampler:
    """A thread that samples until :meth:`stop`; results in ``jobs``, ``device_peak`` etc."""

    def __init__(self, device: Device | None, watch_nvml: bool) -> None:
        self.device = device
        self.watch_nvml = watch_nvml and device is not None and not device.simulated
        self.jobs: dict[str, JobSample] = {}
        self._roots: dict[str, Callable[[], int | None]] = {}
        self._members: dict[str, Callable[[int], list[int] | None]] = {}
        self._root_cache: dict[str, int] = {}
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memgov-pack-sampler", daemon=True)
        self.device_used_before: int | None = None
        self.device_peak: int | None = None
        self.device_total: int | None = None
        self.host_rss_peak = 0
        self.host_uss_peak = 0
        self.host_used_peak = 0
        self.samples = 0
        self.slow_s = SLOW_S
        self.errors: list[str] = []

    # -- registration (main thread) ------------------------------------------------------------
    def track(
        self,
        key: str,
        root: Callable[[], int | None],
        members: Callable[[int], list[int] | None] | None = None,
    ) -> None:
        """``root`` finds the job's first host process; ``members`` (optional) lists all of
        the job's host processes from it (a container's cgroup), else its tree is walked."""
        with self._lock:
            self._roots[key] = root
            if members is not None:
                self._members[key] = members
            self._live.add(key)
            self.jobs.setdefault(key, JobSample())

    def untrack(self, key: str) -> None:
        with self._lock:
            self._live.discard(key)

    def start(self) -> None:
        if self.watch_nvml and self.device is not None:
            try:
                self.device_total, self.device_used_before = _nvml.memory(self.device.uuid)
                self.device_peak = self.device_used_before
            except Exception as exc:
                self._error(f"NVML: {type(exc).__name__}: {exc}")
                self.watch_nvml = False
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    # -- sampling (its own thread) -------------------------------------------------------------
    def _run(self) -> None:
        next_slow = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            slow = now >= next_slow
            if slow:
                next_slow = now + self.slow_s
            try:
                self._sample(slow)
            except Exception as exc:  # a sampling hiccup must never stop the pack
                self._error(f"{type(exc).__name__}: {exc}")
            self._stop.wait(FAST_S)

    def _error(self, text: str) -> None:
        if len(self.errors) < 20 and text not in self.errors:
            self.errors.append(text)

    def _trees(self) -> dict[str, list[int]]:
        import psutil

        with self._lock:
            live = {k: self._roots[k] for k in self._live}
            members = {k: self._members[k] for k in self._live if k in self._members}
        roots: dict[str, int] = {}
        for key, getter in live.items():
            pid = self._root_cache.get(key)
            if pid is None:
                found = getter()
                if found is None:
                    continue
                pid = self._root_cache[key] = found
            roots[key] = pid
        trees: dict[str, list[int]] = {}
        for key in list(roots):
            listed = members[key](roots[key]) if key in members else None
            if listed:
                trees[key] = listed
                del roots[key]
        if not roots:
            return trees
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            ppid = proc.info.get("ppid")
            if ppid:
                children.setdefault(ppid, []).append(proc.pid)
        for key, root in roots.items():
            tree, todo = [], [root]
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo.extend(children.get(pid, ()))
            trees[key] = tree
        return trees

    def _sample(self, slow: bool) -> None:
        trees = self._trees()
        self.samples += 1
        for key, tree in trees.items():
            self.jobs[key].host_pids = tuple(sorted(set(self.jobs[key].host_pids) | set(tree)))
        if self.watch_nvml and self.device is not None:
            self._sample_nvml(self.device.uuid, trees)
        if self.device is not None:
            self._sample_claims(self.device, trees)
        if slow:
            began = time.monotonic()
            self._sample_host(trees)
            # USS reads every mapping of every process: with many big CUDA processes this takes
            # a while, so it never gets more than a fifth of the sampler's time.
            self.slow_s = max(SLOW_S, 5 * (time.monotonic() - began))

    def _sample_nvml(self, uuid: str, trees: dict[str, list[int]]) -> None:
        _total, used = _nvml.memory(uuid)
        self.device_peak = max(self.device_peak or 0, used)
        procs = _nvml.processes(uuid)
        if procs is None:
            return
        for key, tree in trees.items():
            seen = [procs[p] for p in tree if p in procs]
            if not seen:
                continue
            known = [b for b in seen if b is not None]
            if not known:
                continue
            job = self.jobs[key]
            job.footprint = max(job.footprint or 0, sum(known))

    def _sample_host(self, trees: dict[str, list[int]]) -> None:
        import psutil

        rss_all = uss_all = 0
        for key, tree in trees.items():
            rss = uss = 0
            for pid in tree:
                with contextlib.suppress(psutil.Error, OSError):
                    info = psutil.Process(pid).memory_full_info()
                    rss += info.rss
                    uss += info.uss
            job = self.jobs[key]
            job.rss = max(job.rss or 0, rss)
            job.uss = max(job.uss or 0, uss)
            rss_all += rss
            uss_all += uss
        self.host_rss_peak = max(self.host_rss_peak, rss_all)
        self.host_uss_peak = max(self.host_uss_peak, uss_all)
        memory = psutil.virtual_memory()
        self.host_used_peak = max(self.host_used_peak, memory.total - memory.available)

    def _sample_claims(self, device: Device, trees: dict[str, list[int]]) -> None:
        if not trees:
            return
        by_identity: dict[tuple[int | None, int | None], str] = {}
        for key, tree in trees.items():
            for pid in tree:
                by_identity[identity(pid)] = key
        # Read-only and lock-free: the claims of live holders, as any observer sees them.
        snap = DeviceLedger(device).scan(clean=False)
        for entry in snap.claims:
            holder = by_identity.get((entry.pidns, entry.pid))
            if holder is not None:
                job = self.jobs[holder]
                job.claim_bytes, job.claim_mode = entry.bytes, entry.mode
                job.mps_daemon = entry.extra.get("mps_daemon")

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "host_every_s": round(self.slow_s, 2),
            "errors": list(self.errors),
        }
