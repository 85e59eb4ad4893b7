"""The state of every device's budget as plain data: what `memgov status --json` prints."""

from __future__ import annotations

from typing import Any

from memgov import _config, _nvml
from memgov._attribution import Attribution, attribute
from memgov._devices import Device, devices, refresh
from memgov._ledger import DeviceLedger, Snapshot


def snapshots(clean: bool = False) -> list[Snapshot]:
    """Every device's budget. Reads only: a device whose ledger folder does not exist yet (no one
    has claimed on it) is shown as unclaimed, and no folder is created (status, gc, doctor)."""
    result = []
    for device in devices():
        ledger = DeviceLedger(device)
        if not ledger.path.is_dir():
            result.append(_unclaimed(device))
            continue
        with ledger.locked():
            result.append(ledger.scan(clean=clean))
    return result


def _unclaimed(device: Device) -> Snapshot:
    device = refresh(device)
    if device.simulated:
        split = Attribution({}, device.used)
    else:
        split = attribute(device.used, (), _nvml.processes(device.uuid))
    return Snapshot(
        device=device,
        reserve=_config.reserve(device.total, device.simulated),
        claims=[],
        queue=[],
        use={},
        outside=split.outside,
        problems=[],
        removed=[],
    )


def device_dict(device: Device) -> dict[str, Any]:
    return {
        "index": device.index,
        "uuid": device.uuid,
        "name": device.name,
        "total": device.total,
        "used": device.used,
        "simulated": device.simulated,
        "visible_index": device.visible_index,
    }


def snapshot_dict(snap: Snapshot) -> dict[str, Any]:
    """Stable keys: devices[].uuid, total, used, claimed, free, claims[].name, pid, bytes."""
    return {
        **device_dict(snap.device),
        "claimed": snap.claimed,
        "free": snap.free,
        "reserve": snap.reserve,
        "outside": snap.outside,
        "claims": [
            {
                "name": c.name,
                "pid": c.pid,
                "bytes": c.bytes,
                "use": snap.use.get(c.record),
                "mode": c.mode,
                "host": c.host,
                "created": c.created,
                "id": c.id,
                "record": c.record,
            }
            for c in snap.claims
        ],
        "queue": [
            {"name": q.name, "pid": q.pid, "bytes": q.bytes, "created": q.created}
            for q in snap.queue
        ],
        "problems": snap.problems,
    }


def status() -> dict[str, Any]:
    return {"devices": [snapshot_dict(s) for s in snapshots()]}
