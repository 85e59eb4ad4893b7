"""Ledger health counters that outlive the processes that saw the events: per GPU, per user.

    $MEMGOV_DIR/v1/<gpu-uuid>/stats/u<uid>.json

Admission and `memgov gc` are the only places that know when a dead holder's record was
reclaimed, a claim was refused or a queued claim got in; each of them is a short-lived process,
so the count is written where the claims are: one small file per user per GPU, replaced whole
(temp file, fsync, rename; never through a symlink), always while the writer holds that GPU's
admission lock, so two processes of one user never lose each other's update. One file per user
because only root may write the device folder of a shared ledger, and a file in the sticky
``stats/`` folder can be replaced by its owner only: no user can change another user's counts.

A claim that fails with LockTimeout (the admission lock held past its bound) cannot take that
lock to count itself: it appends one byte to ``stats/u<uid>.locktimeouts`` instead, whose size is
the count. An O_APPEND write of one byte needs no lock (the kernel orders appends), so no count
of one user's processes that time out together is lost; and, like the counts file, only its
owner can write it (the exporter skips one that is not its named owner's).

Only the uncommon paths write: a claim admitted at once with nothing to reclaim writes nothing.
Counting never fails a claim: whatever goes wrong (no permission, a full disk, another user's
garbage), the count is skipped. The exporter sums the files (``read``); docs/metrics.md gives
the semantics of each counter.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memgov._base.errors import LockTimeout
from memgov._files import flock as _flock
from memgov._ledger.parse import _bounded_float, _bounded_int, _no_constant, too_deep

if TYPE_CHECKING:
    from memgov._ledger.ledger import DeviceLedger

FOLDER = "stats"
MAX_FILES = 100_000
"""More counter files than this are not read (a display bound of the exporter: it refuses no
claim; the ledger's own folders have no such bound)."""
FILE_NAME = re.compile(r"^u([0-9]{1,10})\.json$")
LOCK_TIMEOUTS = re.compile(r"^u([0-9]{1,10})\.locktimeouts$")
MAX_BYTES = 16 * 1024
MAX_COUNT = 2**53
"""Larger counts are not what memgov writes: the file is skipped as garbage."""
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Upper bounds (seconds) of the admission-wait histogram; one more bucket holds the rest."""
REFUSAL_REASONS = ("no_room", "queued", "no_slot", "too_large", "timeout")
"""no_room: the free budget was too small; queued: others were waiting ahead; no_slot: the MPS
server's clients or the device's CUDA contexts were all taken; too_large: larger than the
device's capacity; timeout: waited in the queue until its wait ran out."""
WAIT_OUTCOMES = ("admitted", "timeout")
LOCK_FOR_COUNT_S = 0.5
"""How long a refusal that holds no lock waits for the admission lock to count itself."""


@dataclass
class Waits:
    """One histogram: count per bucket (not cumulative; the last is above every bound), sum."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        slot = next((i for i, bound in enumerate(WAIT_BUCKETS) if seconds <= bound), -1)
        self.buckets[slot] += 1
        self.sum += seconds

    def merge(self, other: Waits) -> None:
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        self.sum += other.sum


@dataclass
class Counts:
    reclaimed: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0))
    waits: dict[str, Waits] = field(default_factory=lambda: {o: Waits() for o in WAIT_OUTCOMES})
    lock_timeouts: int = 0
    """Claims failed with LockTimeout: the size of u<uid>.locktimeouts (not in the JSON file)."""

    def merge(self, other: Counts) -> None:
        self.reclaimed += other.reclaimed
        self.lock_timeouts += other.lock_timeouts
        for reason in REFUSAL_REASONS:
            self.refused[reason] += other.refused[reason]
        for outcome in WAIT_OUTCOMES:
            self.waits[outcome].merge(other.waits[outcome])

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "reclaimed": self.reclaimed,
            "refused": self.refused,
            "waits": {o: {"buckets": w.buckets, "sum": w.sum} for o, w in self.waits.items()},
        }


def add(
    ledger: DeviceLedger,
    reclaimed: int = 0,
    refused: str | None = None,
    waited: tuple[str, float] | None = None,
) -> None:
    """Count events on ``ledger``'s GPU; call it holding that GPU's admission lock. Never raises
    an Exception: a count that cannot be written is skipped."""
    if not reclaimed and refused is None and waited is None:
        return
    with contextlib.suppress(Exception):
        _add(ledger, reclaimed, refused, waited)


def add_locked(
    ledger: DeviceLedger, refused: str | None = None, waited: tuple[str, float] | None = None
) -> None:
    """:func:`add` for a caller without the lock: take it for at most LOCK_FOR_COUNT_S."""
    with contextlib.suppress(Exception), ledger.locked(LOCK_FOR_COUNT_S):
        _add(ledger, 0, refused, waited)


@contextlib.contextmanager
def lock_timeouts(ledger: DeviceLedger, timeout: float | None) -> Iterator[None]:
    """Count a LockTimeout raised inside on ``ledger``'s GPU, then let it go on, where
    ``timeout`` is None: the lock's own bound (LOCK_TIMEOUT_S), a failure its caller sees. A
    look bounded by the claim's own wait is not counted: that claim is refused (``timeout``)."""
    try:
        yield
    except LockTimeout:
        if timeout is None:
            with contextlib.suppress(Exception):
                _add_lock_timeout(ledger)
        raise


def _add_lock_timeout(ledger: DeviceLedger) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    name = f"u{os.geteuid()}.locktimeouts"
    with _flock.open_dir(ledger.root, (*ledger.parts, FOLDER), create=True) as fd:
        file = _flock.open_owned(name, flags, fd, mode=0o644, writable=True, register=False)
        with file:
            info = os.fstat(file.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                os.write(file.fileno(), b"\n")


def _add(
    ledger: DeviceLedger, reclaimed: int, refused: str | None, waited: tuple[str, float] | None
) -> None:
    name = f"u{os.geteuid()}.json"
    with _flock.open_dir(ledger.root, (*ledger.parts, FOLDER), create=True) as fd:
        counts, _ = _read_file(fd, name)
        counts = counts or Counts()
        counts.reclaimed += reclaimed
        if refused is not None:
            counts.refused[refused] += 1
        if waited is not None:
            counts.waits[waited[0]].observe(waited[1])
        data = json.dumps(counts.to_json(), sort_keys=True).encode()
        # No fsync: this runs under the admission lock, where an fsync would wait for every
        # pending change of the filesystem (another user's flood of files included) while all
        # claimers wait; counts lost to a crash of the host are counts, not budget.
        _flock.write_atomic(fd, name, data, durable=False)


def read(ledger: DeviceLedger) -> tuple[dict[int, Counts], list[str]]:
    """Every user's counts on ``ledger``'s GPU, and why any file was skipped. Reads only: no
    folder is created, a missing one means nothing was counted yet."""
    found: dict[int, Counts] = {}
    problems: list[str] = []
    try:
        with _flock.open_dir(ledger.root, (*ledger.parts, FOLDER), create=False) as fd:
            names = os.listdir(fd)
            if len(names) > MAX_FILES:
                return {}, [f"{FOLDER}/ holds {len(names)} files; not read"]
            for name in sorted(names):
                match = FILE_NAME.match(name) or LOCK_TIMEOUTS.match(name)
                if match is None:
                    continue  # temporary files and anything else
                uid = int(match.group(1))
                reader = _read_file if match.re is FILE_NAME else _read_lock_timeouts
                counts, problem = reader(fd, name, uid)
                if counts is not None:
                    counts.merge(found.pop(uid, Counts()))
                    found[uid] = counts
                elif problem is not None:
                    problems.append(f"{FOLDER}/{name}: {problem}")
    except FileNotFoundError:
        return {}, []
    except OSError as exc:
        return {}, [f"{FOLDER}/: {exc.strerror or exc}"]
    return found, problems


def _read_lock_timeouts(folder_fd: int, name: str, owner: int) -> tuple[Counts | None, str | None]:
    """The lock timeouts counted in one u<uid>.locktimeouts file: its size, read from its
    descriptor (never through a symlink, only where it is its named owner's)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        file = _flock.open_owned(name, flags, folder_fd, register=False)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    with file:
        info = os.fstat(file.fileno())
    if not stat.S_ISREG(info.st_mode):
        return None, "not a regular file"
    if info.st_uid != owner:
        return None, f"owned by uid {info.st_uid}, not {owner}"
    if info.st_size > MAX_COUNT:
        return None, f"too large ({info.st_size} bytes)"
    return Counts(lock_timeouts=info.st_size), None


def _read_file(
    folder_fd: int, name: str, owner: int | None = None
) -> tuple[Counts | None, str | None]:
    """The counts in one file, or None and why not (None when it does not exist)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:  # owned by a FileIO at once: no interrupt between open and close leaks it
        file = _flock.open_owned(name, flags, folder_fd, register=False)
    except FileNotFoundError:
        return None, None
    except IsADirectoryError:
        return None, "not a regular file"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    fd = file.fileno()
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if owner is not None and info.st_uid != owner:
            return None, f"owned by uid {info.st_uid}, not {owner}"
        if info.st_size > MAX_BYTES:
            return None, f"too large ({info.st_size} bytes)"
        raw = os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    finally:
        file.close()
    try:
        return _parse_counts(raw), None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as exc:
        return None, f"not memgov's counts ({str(exc)[:100]})"


def _parse_counts(raw: bytes) -> Counts:
    text = raw.decode()
    if too_deep(text, 4):
        raise ValueError("nested too deep")
    data = json.loads(
        text, parse_int=_bounded_int, parse_float=_bounded_float, parse_constant=_no_constant
    )
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ValueError("not a version 1 object")
    counts = Counts(reclaimed=_count(data["reclaimed"]))
    refused = data["refused"]
    for reason in REFUSAL_REASONS:
        counts.refused[reason] = _count(refused.get(reason, 0))
    for outcome in WAIT_OUTCOMES:
        waits = data["waits"][outcome]
        buckets = waits["buckets"]
        if not isinstance(buckets, list) or len(buckets) != len(WAIT_BUCKETS) + 1:
            raise ValueError(f"waits.{outcome}: {len(WAIT_BUCKETS) + 1} buckets expected")
        total = waits["sum"]
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not total >= 0:
            raise ValueError(f"waits.{outcome}.sum: a number >= 0 expected")
        counts.waits[outcome] = Waits([_count(b) for b in buckets], float(total))
    return counts


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"a count from 0 to 2**53 expected, not {str(value)[:40]}")
    return value
