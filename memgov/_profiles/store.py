"""Profiles: each job's measured peaks, one private store per user, in the ledger's folder.

    $MEMGOV_DIR/v1/_profiles/<uid>/            this user's store: owned by the user, mode 0700
    $MEMGOV_DIR/v1/_profiles/<uid>/<job>.json  one job's last KEEP runs (peak, how it ended, ...)
    $MEMGOV_DIR/v1/_profiles/<uid>/live/*.json one per running governed process, flock-held
    $MEMGOV_DIR/v1/_profiles/<uid>/.lock       serialises this user's writers
    $MEMGOV_DIR/v1/_profiles/<uid>/<job>.first  flock-held by the job's first run in flight

Another user can neither read this store (0700) nor poison it: a ``<uid>`` folder that another
user made first, or a file in it that is not this user's, is refused with an error saying so,
and ``auto`` then sizes without a profile. Every open is O_NOFOLLOW relative to a checked folder
(``_flock.open_dir``), every write is ``_flock.write_atomic`` (whole or not at all), content is
parsed with the ledger's bounds (``_parse``). A file that is not a profile is never overwritten:
the run that would have gone into it stays in its live file, so nothing is lost
(docs/profiles.md).

Bounds: :data:`KEEP` runs per job, :data:`MAX_ENTRIES` jobs per user (the least recently
recorded goes first), :data:`MAX_BYTES` per file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import LedgerError, ProfileError
from memgov._files import flock as _flock
from memgov._files.flock import AdmissionLock, open_owned, try_lock
from memgov._ledger import parse as _parse, records as _records

LIVE = "live"
VERSION = 1
KEEP = 32
"""Runs kept per job (the oldest go first)."""
MAX_ENTRIES = 256
"""Jobs kept per user (the least recently recorded goes first)."""
MAX_BYTES = 64 * 1024
MARGIN_FRACTION = 0.10
MARGIN_BYTES = 64 * 2**20
OOM_GROWTH = 1.5
"""After a run ran out of memory under a claim, the next claims ask this much more than it."""
OOM_GROWTHS = 2
"""How many times in a row an OOM grows a job's claim (at most 1.5 x 1.5 = 2.25 x the first
claim that ran out): a job that runs out whatever it gets (a bug) stops growing there. The
queue re-runs an OOMed ``auto`` job as often (memgov/queue/model.py MAX_RETRIES)."""
FIRST = ".first"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
ENDS = ("exit", "released", "oom", "error", "killed")


def margin(peak: int) -> int:
    """The documented size for a measured peak: peak x 1.10 + 64 MiB, rounded up to a MiB."""
    return math.ceil((peak * (1 + MARGIN_FRACTION) + MARGIN_BYTES) / 2**20) * 2**20


def file_name(job: str) -> str:
    """The store's file of ``job``: readable part + hash, so no two jobs share a file."""
    return f"{_SAFE.sub('_', job)[:80]}-{sha256(job.encode()).hexdigest()[:10]}.json"


@dataclass
class Profile:
    job: str
    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    file: str = ""
    updated: float = 0.0
    command: str | None = None
    """The command of the job's last recorded run (what tells jobs of one label apart)."""


# -- the folder ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _writing(fd: int, path: Path) -> Iterator[None]:
    with AdmissionLock(path / ".lock", _config.LOCK_TIMEOUT_S):
        yield


# -- reading ------------------------------------------------------------------------------------


def _load(fd: int, path: Path, name: str) -> dict[str, Any] | None:
    """A profile file's content; None when there is none; ProfileError when it is not a good
    profile of this user's (the message says which file and why)."""
    where = path / name
    try:
        # Owned by a FileIO before any bytecode runs (_flock.open_owned): no interrupt leaks it.
        file = open_owned(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, fd)
    except IsADirectoryError:
        raise ProfileError(
            f"profile {where}: not a regular file; move it away or `memgov profiles forget`"
        ) from None
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "a symlink (not followed)" if exc.errno == errno.ELOOP else exc.strerror
        raise ProfileError(
            f"profile {where}: {why}; move it away or `memgov profiles forget`"
        ) from None
    try:
        file_fd = file.fileno()
        info = os.fstat(file_fd)
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = "not a regular file"
        elif info.st_uid != os.geteuid():
            problem = f"belongs to uid {info.st_uid}, not you"
        elif info.st_size > MAX_BYTES:
            problem = f"too large ({info.st_size} bytes, at most {MAX_BYTES})"
        raw = b"" if problem else os.read(file_fd, MAX_BYTES + 1)
    finally:
        file.close()
    if problem is None:
        data, problem = _decode(raw)
        if data is not None:
            return data
    raise ProfileError(
        f"profile {where} is not a memgov profile ({problem}); it is left as it "
        "is: move it away, or `memgov profiles forget JOB` removes it"
    )


def _decode(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    data, problem = _parse.load_bounded(raw)
    if problem is not None:
        return None, problem
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return None, f"not a version {VERSION} profile"
    if not isinstance(data.get("job"), str) or not isinstance(data.get("runs"), list):
        return None, "no job name or run list"
    data["runs"] = [r for r in data["runs"] if _good_run(r)]
    return data, ""


def _good_run(run: object) -> bool:
    if not isinstance(run, dict):
        return False
    peak, claim = run.get("peak"), run.get("claim")
    return (
        (peak is None or (type(peak) is int and 0 <= peak < 2**62))
        and (claim is None or (type(claim) is int and 0 < claim < 2**62))
        and run.get("end") in ENDS
        and isinstance(run.get("time"), (int, float))
    )


def _profile(data: dict[str, Any], name: str, fd: int) -> Profile:
    try:
        updated = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
    except OSError:
        updated = 0.0
    label, command = data.get("label"), data.get("command")
    return Profile(
        data["job"],
        label if isinstance(label, str) else data["job"],
        data["runs"],
        name,
        updated,
        command if isinstance(command, str) else None,
    )


def read(job: str) -> Profile | None:
    """``job``'s profile (runs oldest first), None when nothing is recorded; ProfileError for a
    bad file or a folder that is not this user's."""
    collect()
    with _flock.private_folder() as (fd, path):
        data = _load(fd, path, file_name(job))
        return None if data is None else _profile(data, file_name(job), fd)


def every() -> tuple[list[Profile], list[str]]:
    """All of this user's profiles (most recent first), and the problems of bad files."""
    collect()
    found: list[Profile] = []
    problems: list[str] = []
    with _flock.private_folder() as (fd, path):
        for name in sorted(os.listdir(fd)):
            if not name.endswith(".json") or name.startswith(_flock.TMP_PREFIX):
                continue
            try:
                data = _load(fd, path, name)
            except ProfileError as exc:
                problems.append(str(exc))
                continue
            if data is not None:
                found.append(_profile(data, name, fd))
    found.sort(key=lambda p: p.updated, reverse=True)
    return found, problems


# -- writing ------------------------------------------------------------------------------------


def record(job: str, label: str, runs: list[dict[str, Any]], command: str | None = None) -> Profile:
    """Add ``runs`` to ``job``'s profile (keeping the last KEEP); returns the profile. A bad
    file in the way raises ProfileError and is left as it is."""
    with _flock.private_folder() as (fd, path), _writing(fd, path):
        return _record(fd, path, job, label, runs, command)


def _record(
    fd: int, path: Path, job: str, label: str, runs: list[dict[str, Any]], command: str | None
) -> Profile:
    name = file_name(job)
    data = _load(fd, path, name)
    if data is None:
        data = {"version": VERSION, "job": job, "label": label, "runs": []}
        _evict(fd, path, keep=MAX_ENTRIES - 1)
    if command:
        data["command"] = command[:1024]
    data["runs"] = [*data["runs"], *(r for r in runs if _good_run(r))][-KEEP:]
    raw = json.dumps(data, indent=1, sort_keys=True).encode()
    _flock.write_atomic(fd, name, raw, mode=0o600)
    return _profile(data, name, fd)


def _evict(fd: int, path: Path, keep: int) -> None:
    """Remove the least recently recorded profiles beyond ``keep``."""
    names = [
        n for n in os.listdir(fd) if n.endswith(".json") and not n.startswith(_flock.TMP_PREFIX)
    ]
    if len(names) <= keep:
        return

    def age(name: str) -> float:
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
        except OSError:
            return 0.0

    for name in sorted(names, key=age)[: len(names) - keep]:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=fd)


def forget(job: str) -> bool:
    """Remove ``job``'s profile, whatever its content; False when there was none."""
    with _flock.private_folder() as (fd, path), _writing(fd, path):
        try:
            os.unlink(file_name(job), dir_fd=fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ProfileError(f"cannot remove {path / file_name(job)}: {exc.strerror}") from None
    return True


# -- the first run of a job in flight --------------------------------------------------------

_first: dict[str, io.FileIO] = {}
"""Job -> the flock-held ``<job>.first`` file of this process's first run of it (closed by
end_first; a forked child never holds it: the descriptor is registered, memgov/_files/flock.py)."""


def hold_first(job: str) -> int | None:
    """Become ``job``'s first run in flight: None when this process holds its ``.first`` lock
    (now or already), else the holder's PID (0 when it has not written it yet). The lock is the
    file's flock, so a holder that dies (SIGKILL included) frees it at once."""
    if job in _first:
        return None
    name = file_name(job)[: -len(".json")] + FIRST
    with _flock.private_folder() as (fd, path):
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            file = open_owned(name, flags, fd, mode=0o600, writable=True)
        except OSError as exc:
            raise ProfileError(f"cannot open {path / name}: {exc.strerror or exc}") from None
        try:
            if not try_lock(file, fcntl.LOCK_EX, path / name):
                raw = os.pread(file.fileno(), 32, 0)
                return int(raw) if raw.strip().isdigit() else 0
            os.ftruncate(file.fileno(), 0)
            os.pwrite(file.fileno(), str(os.getpid()).encode(), 0)
        except BaseException:
            file.close()
            raise
    _first[job] = file
    return None


def end_first(job: str) -> None:
    """Free ``job``'s first-run lock if this process holds it (its run was recorded)."""
    file = _first.pop(job, None)
    if file is not None:
        file.close()


def live_peak(job: str) -> int:
    """The largest peak sampled so far by this user's running runs of ``job`` (0: none)."""
    peaks = [0]
    with contextlib.suppress(OSError, LedgerError, ProfileError), _live(create=False) as (fd, path):
        for seen in _records.scan(fd, path):
            run = seen.data.get("run") if seen.alive and seen.data else None
            if isinstance(run, dict) and seen.data and seen.data.get("job") == job:
                peak = run.get("peak")
                peaks.append(peak if type(peak) is int and peak > 0 else 0)
    return max(peaks)


# -- live runs: crash-safe peaks ----------------------------------------------------------------


@contextlib.contextmanager
def _live(create: bool) -> Iterator[tuple[int, Path]]:
    """This user's live-run folder (inside the checked private store)."""
    with (
        _flock.private_folder(create) as (_fd, path),
        _flock.open_dir(
            _config.ledger_dir(), (*_flock.PARTS, path.name, LIVE), create=create
        ) as live,
    ):
        yield live, path / LIVE


def start_live(payload: dict[str, Any]) -> _records.Held:
    """This process's live run file, flock-held for its life; its holder updates the peak."""
    with _live(create=True) as (fd, path):
        return _records.create(fd, path, _records.new_record_name(), payload)


def update_live(held: _records.Held, payload: dict[str, Any]) -> None:
    with _live(create=False) as (fd, _path):
        _records.replace(fd, held, payload)


def end_live(held: _records.Held) -> None:
    with _live(create=False) as (fd, _path):
        _records.release(fd, held)


def collect() -> list[str]:
    """Fold the runs of this user's dead processes (SIGKILL, OOM killer: no exit handler ran)
    into their profiles, then remove their live files; a run whose profile is bad stays in its
    live file (nothing is lost). Returns the jobs folded."""
    folded: list[str] = []
    try:
        with (
            _flock.private_folder() as (fd, path),
            _writing(fd, path),
            _live(create=True) as (live, where),
        ):
            for seen in _records.scan(live, where):
                # Dead for good only (``final``: unlocked, and still the file of its name): a
                # running run whose peak grew replaces its file, and the old one, unlocked as
                # the new one takes its name, is not a dead run (folded, its old peak would
                # size the job's next claims into an OOM).
                if not seen.final or seen.data is None or seen.owner != os.geteuid():
                    continue
                run = seen.data.get("run")
                job, label = seen.data.get("job"), seen.data.get("label")
                if isinstance(run, dict) and isinstance(job, str) and isinstance(label, str):
                    ended = {**run, "end": run.get("end") or "killed"}
                    with contextlib.suppress(ProfileError):
                        _record(fd, path, job, label, [ended], seen.data.get("command"))
                        folded.append(job)
                        _records.remove_dead(live, seen)
    except (OSError, LedgerError):
        return folded  # a store that cannot be used: the caller finds out when it reads
    return folded
