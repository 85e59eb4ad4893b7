"""Admission reads NVML before it takes the device's lock, and says where its time went.

While a hundred processes create CUDA contexts an NVML query can take seconds; under the lock it
would serialise every claimer behind it. NVML cannot be queried here (no GPU), so the device is
made real by hand and the two NVML reads are replaced by probes that look at the lock.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import replace
from pathlib import Path

import pytest

import memgov
from memgov import _claim
from memgov._gpu import devices as _devices, nvml as _nvml
from memgov._ledger import ledger as _ledger


def _lock_free(path: Path) -> bool:
    """Whether nobody holds ``path``'s flock right now (a separate open file description)."""
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def test_nvml_is_read_outside_the_admission_lock(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = replace(_devices.candidates(None)[0], simulated=False)
    lock = _ledger.DeviceLedger(fake).path / "admission.lock"
    seen: list[tuple[str, bool]] = []

    def memory(device: _devices.Device) -> _devices.Device:
        seen.append(("memory", _lock_free(lock)))
        return replace(device, used=0)

    def processes(uuid: str) -> dict[int, int | None]:
        seen.append(("processes", _lock_free(lock)))
        return {}

    monkeypatch.setattr(_devices, "candidates", lambda selector: [fake])
    monkeypatch.setattr(_ledger, "refresh", memory)
    monkeypatch.setattr(_nvml, "processes", processes)
    monkeypatch.setattr(_claim._adapters, "any_cuda_initialized", lambda: True)  # no pinning
    held = memgov.claim("1GiB")
    try:
        assert held.reports["admission"].startswith("admission: ")
        assert "1 look(s) under the admission lock" in held.reports["admission"]
        assert 0 <= held.admission_s < 30
    finally:
        held.release()
    assert ("memory", True) in seen and ("processes", True) in seen
    assert all(free for _, free in seen), seen


def test_a_claim_reports_its_admission(sim: str) -> None:
    with memgov.claim("1GiB") as held:
        line = held.reports["admission"]
        assert "waited" in line and "NVML 0.000 s" in line  # a simulated device has no NVML
