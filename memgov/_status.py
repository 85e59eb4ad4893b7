"""The state of every device's budget as plain data: what `memgov status --json` prints."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import LedgerError
from memgov._files import flock as _flock
from memgov._files.trust import set_up_advice
from memgov._gpu import nvml as _nvml
from memgov._gpu.devices import Device, devices, refresh
from memgov._ledger import stats as _stats
from memgov._ledger.attribution import Attribution, attribute
from memgov._ledger.ledger import DeviceLedger, Snapshot


def snapshots(clean: bool = False, set_up: bool = False) -> list[Snapshot]:
    """Every device's budget. Reads only: a device whose ledger folder does not exist yet (no one
    has claimed on it) is shown as unclaimed, and no folder is created (status, gc, doctor),
    unless ``set_up``: root's `memgov gc` is the admin set-up of a shared ledger and makes every
    device's folders (and the CPU-share folder) with the modes other users need. ``clean`` (gc)
    removes every file no one holds, whatever its name.

    A ledger that claims cannot use (MEMGOV_DIR a file, another user's, unreachable, or missing
    where only root may make it) is a LedgerError saying so: never "no claims"."""
    if set_up:
        for shared in (("v1", "cpu"), *PER_USER):  # every user's, sticky
            with _flock.open_dir(_config.ledger_dir(), shared, create=True):
                pass
    return [snapshot(device, clean=clean, set_up=set_up) for device in devices()]


PER_USER = (("v1", "_profiles"), ("v1", "_queue"))
"""Sticky folders of one private folder per user, named by its uid (memgov/_profiles/store.py,
memgov/queue/store.py)."""


def clear_squatters() -> tuple[list[str], list[str]]:
    """Root's gc: remove each ``<uid>`` entry of PER_USER that is not that user's own folder (a
    folder another user made first, a symlink, a file). Its user could never use it (the store
    refuses it, never adopts it) and only root may remove it. (removed, could not remove)."""
    import stat

    removed: list[str] = []
    skipped: list[str] = []
    root = _config.ledger_dir()
    for parts in PER_USER:
        try:
            with _flock.open_dir(root, parts, create=False) as fd:
                for name in os.listdir(fd):
                    where = root.joinpath(*parts, name)
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if not name.isdigit() or (
                            stat.S_ISDIR(info.st_mode) and info.st_uid == int(name)
                        ):
                            continue
                        if stat.S_ISDIR(info.st_mode):
                            _remove_tree(fd, name)
                        else:
                            os.unlink(name, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    except OSError as exc:
                        skipped.append(f"{where} (not uid {name}'s): {exc.strerror or exc}")
                        continue
                    removed.append(f"{where} (uid {info.st_uid}'s, not uid {name}'s own folder)")
        except FileNotFoundError:
            continue
    return removed, skipped


def _remove_tree(parent: int, name: str) -> None:
    """Remove folder ``name`` of ``parent`` and all in it, never through a symlink (a name
    swapped for one meanwhile is an OSError)."""
    import stat

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=parent)
    try:
        for entry in os.listdir(fd):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                _remove_tree(fd, entry)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def snapshot(
    device: Device, clean: bool = False, set_up: bool = False, lock: bool = True
) -> Snapshot:
    """One device's budget (see :func:`snapshots`). ``lock=False`` reads without the admission
    lock (the exporter: a scrape must not wait behind admissions, nor behind a process that holds
    the lock); every record is read whole either way, only the set of records may be a moment
    apart. Dead holders' records removed by ``clean`` are counted (_stats)."""
    ledger = DeviceLedger(device)
    if not set_up and not _present(ledger):
        return _unclaimed(device)
    if not lock:
        return ledger.scan(clean=False)
    swept: Snapshot | None = None
    if not clean:
        # A read-only view (status) judges the files before the admission lock too; under it,
        # it looks only at what it did not find dead for good then. What it found is said.
        swept = ledger.scan(clean=False, memo="note")
    else:
        # gc's sweep runs outside the admission lock: removing a file no one holds needs no lock
        # (releases take none either), and a flood must not hold every admission up meanwhile.
        swept = ledger.scan(clean=True, sweep=True)
        # What arrived while the sweep ran (a flood goes on being planted) is judged and
        # removed before the lock too: the scan under it then meets only the last moment's.
        ahead = ledger.look_ahead()
        if ahead is not None:
            swept.removed.extend(ahead.removed)
            swept.problems.extend(ahead.problems)
    with ledger.locked():
        if set_up:
            with _flock.open_dir(ledger.root, (*ledger.parts, _stats.FOLDER), create=True):
                pass
        snap = ledger.scan(clean=clean, memo=None if clean else "use")
        if clean:
            snap.rebuilt = ledger.compact()
        # In place: the files found dead under the lock join snap.removed once it is released.
        snap.removed[:0] = swept.removed
        snap.problems[:] = list(dict.fromkeys([*swept.problems, *snap.problems]))
        _stats.add(ledger, reclaimed=len(swept.removed) + snap.reclaimed)
    if clean:
        snap.removed.extend(ledger.remove_rebuilt())  # nothing is removed under the lock
    return snap


def _sections_usable(ledger: DeviceLedger) -> None:
    """The device's folder, and the claims and queue folders in it that exist, are folders a
    claim can use (a LedgerError says why not): a claim fails on any of them."""
    if not _present(ledger):
        return
    for section in ("claims", "queue"):  # the folders a claim reads (DeviceLedger.read)
        with (
            contextlib.suppress(FileNotFoundError),  # missing: the first claim makes it
            _flock.open_dir(ledger.root, (*ledger.parts, section), create=False),
        ):
            pass


def _present(ledger: DeviceLedger) -> bool:
    """Whether the device's folder exists (checked like every ledger path). If it does not, a
    claim makes it: a LedgerError says so when it cannot (only root may, or no one here)."""

    existing: tuple[Path, os.stat_result] | None = None
    for depth in range(len(ledger.parts) + 1):
        path = ledger.root.joinpath(*ledger.parts[:depth])
        try:
            with _flock.open_dir(ledger.root, ledger.parts[:depth], create=False) as fd:
                existing = (path, os.fstat(fd))
        except FileNotFoundError:
            break
    else:
        return True
    if existing is None:  # MEMGOV_DIR itself is missing: a claim makes it, as mkdir -p would
        above = ledger.root.parent
        while not above.exists() and above != above.parent:
            above = above.parent
        if not os.access(above, os.W_OK | os.X_OK):
            raise LedgerError(
                f"ledger folder {ledger.root} is missing and this user may not make it in "
                f"{above}, so every claim fails; " + set_up_advice(ledger.root)
            )
        return False
    folder, info = existing
    if os.geteuid() != 0 and info.st_uid != os.geteuid():
        raise LedgerError(
            f"{path} is missing and {folder} belongs to uid {info.st_uid}: only root makes "
            f"folders there, so every claim on {ledger.device.uuid} fails until root runs "
            "`sudo memgov gc` (docs/ledger.md, 'Set-ups')"
        )
    return False


def ledger_problem() -> str | None:
    """Why claims cannot use the ledger here (doctor), or None when they can."""
    from memgov._base.errors import MemgovError

    try:
        found = devices()
    except MemgovError:
        found = []
    try:
        for device in found:
            _sections_usable(DeviceLedger(device))
        if not found:
            with _flock.open_dir(_config.ledger_dir(), (), create=False):
                pass
    except FileNotFoundError:
        return None  # no ledger yet: the first claim makes it
    except (MemgovError, OSError) as exc:
        return str(exc)
    return None


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


def snapshot_dict(snap: Snapshot, threads: dict[str, int | None] | None = None) -> dict[str, Any]:
    """Stable keys: devices[].uuid, total, used, claimed, free, claims[].name, pid, bytes.

    ``threads``: claim holder ("<uuid>/<record>") -> its CPU threads now
    (memgov/_cpu/threads.py)."""
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
                "uid": c.uid,
                "bytes": c.bytes,
                "use": snap.use.get(c.record),
                "mode": c.mode,
                "host": c.host,
                "created": c.created,
                "id": c.id,
                "record": c.record,
                "threads": (threads or {}).get(f"{snap.device.uuid}/{c.record}"),
                # Where the size came from (given, scheduler, profile, first-run) and the job
                # whose profile it is (docs/profiles.md); other users' text: strings or None.
                "sized": _text(c.extra.get("sized")),
                "job": _text(c.extra.get("job")),
            }
            for c in snap.claims
        ],
        "queue": [
            {"name": q.name, "pid": q.pid, "uid": q.uid, "bytes": q.bytes, "created": q.created}
            for q in snap.queue
        ],
        "problems": snap.problems,
    }


def _text(value: object) -> str | None:
    return value[:128] if isinstance(value, str) else None


def status() -> dict[str, Any]:
    threads = claim_threads()
    return {"devices": [snapshot_dict(s, threads) for s in snapshots()]}


def claim_threads() -> dict[str, int | None]:
    """Each live claim's CPU threads, from the governed processes' records (read only)."""
    from memgov._cpu import share as _cpushare

    try:
        return {p.holder: p.threads for p in _cpushare.peers(clean=False) if p.holder}
    except Exception:  # the threads column is a detail: never fail `memgov status` for it
        return {}
