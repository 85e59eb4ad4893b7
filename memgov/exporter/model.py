"""One reading of everything the exporter shows, as plain data (no prometheus_client here).

The ledger is read with memgov status's own readers (memgov._status: the records through
memgov._ledger.ledger and memgov._ledger.records), without the admission lock and without removing
anything: a scrape never waits behind admissions, never changes the ledger, and a device whose
ledger cannot be read is shown as unreadable while the others are still shown. Another user's files
(garbage, symlinks, huge or foreign records) are skipped by those readers and counted as
problems. The counters are memgov._ledger.stats's; NVML is read by memgov._gpu.devices as for
status.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

from memgov import _status
from memgov._base.errors import MemgovError
from memgov._gpu import devices as _devices, mpsctl as _mpsctl, nvml as _nvml
from memgov._gpu.devices import Device, devices
from memgov._ledger import stats as _stats
from memgov._ledger.ledger import DeviceLedger, Entry, Snapshot
from memgov.exporter import queue
from memgov.exporter.holders import Holder, HolderFinder, forget_all_but


@dataclass
class Claim:
    entry: Entry
    used: int | None
    threads: int | None
    holder: Holder
    age_s: float


@dataclass
class Gpu:
    device: Device
    snapshot: Snapshot | None
    error: str | None
    claims: list[Claim] = field(default_factory=list)
    counts: dict[int, _stats.Counts] = field(default_factory=dict)
    count_problems: list[str] = field(default_factory=list)


@dataclass
class Reading:
    hostname: str
    gpus: list[Gpu]
    mps_daemons: int
    error: str | None
    """Why no device could be listed at all (NVML, MEMGOV_DEVICES), or None."""
    seconds: float
    queues: queue.Queues = field(default_factory=queue.Queues)
    """Every user's job queue (memgov/exporter/queue.py)."""


def node_name() -> str:
    """The Hostname label: NODE_NAME (a DaemonSet passes the node's name) or this host's name,
    as dcgm-exporter does."""
    return os.environ.get("NODE_NAME", "").strip() or socket.gethostname()


def read() -> Reading:
    start = time.monotonic()
    hostname = node_name()
    try:
        listed = devices()
    except MemgovError as exc:
        return Reading(hostname, [], 0, str(exc), time.monotonic() - start)
    if not listed and _devices.simulated_spec() is None and _nvml.unavailable_reason():
        why = f"no GPU listed: NVML: {_nvml.unavailable_reason()}"
        return Reading(hostname, [], 0, why, time.monotonic() - start)
    threads = _status.claim_threads()
    finder = HolderFinder("KUBERNETES_SERVICE_HOST" in os.environ, hostname)
    gpus = [_gpu(device, threads, finder) for device in listed]
    forget_all_but({(c.entry.record, c.entry.id) for g in gpus for c in g.claims})
    try:
        daemons = len(_mpsctl.running_daemons())
    except (MemgovError, OSError):
        daemons = 0
    queues = queue.read()
    return Reading(hostname, gpus, daemons, None, time.monotonic() - start, queues)


def _gpu(device: Device, threads: dict[str, int | None], finder: HolderFinder) -> Gpu:
    try:
        snap = _status.snapshot(device, lock=False)
    except (MemgovError, OSError) as exc:
        return Gpu(device, None, str(exc))
    gpu = Gpu(snap.device, snap, None)
    now = time.time()
    for entry in snap.claims:
        gpu.claims.append(
            Claim(
                entry=entry,
                used=snap.use.get(entry.record),
                threads=threads.get(f"{snap.device.uuid}/{entry.record}"),
                holder=finder.holder(entry),
                age_s=max(0.0, now - entry.created),
            )
        )
    gpu.counts, gpu.count_problems = _stats.read(DeviceLedger(device))
    return gpu
