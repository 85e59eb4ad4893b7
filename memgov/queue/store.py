"""Each user's job queue on disk, beside the ledger, private and written whole or not at all.

    $MEMGOV_DIR/v1/_queue/<uid>/              this user's queue: owned by the user, mode 0700
    $MEMGOV_DIR/v1/_queue/<uid>/jobs/N.json   one job: its command, claim, state and attempts
    $MEMGOV_DIR/v1/_queue/<uid>/live/*.json   one per running attempt, flock-held by the runner
                                              that launches it, then by its shepherd
    $MEMGOV_DIR/v1/_queue/<uid>/results/      how each attempt ended (written by its shepherd)
    $MEMGOV_DIR/v1/_queue/<uid>/logs/N.log    each job's output (every attempt, appended)
    $MEMGOV_DIR/v1/_queue/<uid>/runner/       the runner's record, flock-held for its life
    $MEMGOV_DIR/v1/_queue/<uid>/.lock         serialises this user's writers
    $MEMGOV_DIR/v1/_queue/<uid>/learned.json  solo times and co-location slowdowns learned

The same rules as the profile store (memgov/_profiles/store.py): a ``<uid>`` folder another user
made first, a symlink, or a file that is not this user's is refused with an error naming it; every
open is O_NOFOLLOW relative to a checked folder; every write is ``_flock.write_atomic``;
content is parsed with the ledger's bounds. A bad job file is never overwritten: listing names
it as a problem, and only ``memgov queue cancel ID`` removes it. Another user can neither read
nor change this store (0700), so nobody else can see, cancel or alter these jobs.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memgov._base import config as _config
from memgov._base.errors import LedgerError, QueueError
from memgov._files import flock as _flock, trust as _trust
from memgov._files.flock import AdmissionLock
from memgov._ledger import parse as _parse, records as _records
from memgov.queue.model import Job

PARTS = ("v1", "_queue")
"""``_queue``: a name no device folder takes (like ``_profiles``); root's gc makes it 1777."""
FILE_MODE = 0o600
MAX_BYTES = 512 * 1024
"""A job file holds its environment (what `memgov queue add` saw): a few KiB, bounded."""
SUBFOLDERS = ("jobs", "live", "results", "logs", "runner")


def _id_name(job_id: int) -> str:
    return f"{job_id}.json"


class Store:
    """This user's queue store (``root``: MEMGOV_DIR, read when used)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root

    @property
    def path(self) -> Path:
        return (self.root or _config.ledger_dir()).joinpath(*PARTS, str(os.geteuid()))

    # -- folders ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def folder(self, sub: str | None = None, create: bool = True) -> Iterator[int]:
        """A descriptor of this user's store (or one of its SUBFOLDERS), checked to be private
        and this user's."""
        root = self.root or _config.ledger_dir()
        path = self.path
        with _flock.open_dir(root, PARTS, create=create) as parent:
            stack: _trust.Stack = []  # each folder closed when freed, whatever interrupts
            try:
                _flock.open_private(stack, parent, path, create, QueueError, "queue")
                if sub is not None:
                    top = _trust.top(stack)
                    _flock.open_private(stack, top, path / sub, create, QueueError, "queue")
                yield _trust.top(stack)
            finally:
                _trust.close_all(stack)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Serialise this user's writers (the runner, `add`, `cancel`)."""
        with self.folder():
            pass  # made and checked before its lock file is used
        with AdmissionLock(self.path / ".lock", _config.LOCK_TIMEOUT_S):
            yield

    # -- jobs ---------------------------------------------------------------------------------

    def add(self, jobs: list[Job]) -> list[Job]:
        """Give each job the next free id and write it; returns them."""
        with self.writing(), self.folder("jobs") as fd:
            taken = [_number(n) for n in os.listdir(fd)]
            seq = max([0, *(n for n in taken if n is not None), self._seq()])
            for job in jobs:
                seq += 1
                job.id = seq
                _write(fd, _id_name(job.id), job.to_json())
            self._set_seq(seq)
        return jobs

    def _seq(self) -> int:
        data = self.read_extra("seq.json")
        value = data.get("last") if data else None
        return value if type(value) is int and value >= 0 else 0

    def _set_seq(self, seq: int) -> None:
        with self.folder() as fd:
            _write(fd, "seq.json", {"last": seq})

    def jobs(self) -> tuple[list[Job], list[str]]:
        """Every job (by id) and the problems of files that are not jobs."""
        found: list[Job] = []
        problems: list[str] = []
        with self.folder("jobs") as fd:
            for name in sorted(os.listdir(fd), key=lambda n: (_number(n) or 0, n)):
                if name.startswith(_flock.TMP_PREFIX):
                    continue
                try:
                    found.append(self._load(fd, name))
                except QueueError as exc:
                    problems.append(str(exc))
        return found, problems

    def get(self, job_id: int) -> Job:
        with self.folder("jobs") as fd:
            return self._load(fd, _id_name(job_id))

    def _load(self, fd: int, name: str) -> Job:
        where = self.path / "jobs" / name
        if _number(name) is None:
            raise QueueError(f"queue job {where}: not a job file (jobs are named N.json)")
        data = read_json(fd, name, where)
        if data is None:
            raise QueueError(f"no job {name.removesuffix('.json')} in your queue ({where})")
        return Job.from_json(data, str(where))

    def update(self, job_id: int, change: Callable[[Job], None]) -> Job:
        """Read job ``job_id``, apply ``change``, write it back, all under the writers' lock."""
        with self.writing(), self.folder("jobs") as fd:
            job = self._load(fd, _id_name(job_id))
            change(job)
            _write(fd, _id_name(job.id), job.to_json())
            return job

    def remove(self, job_id: int) -> bool:
        """Remove a job's file whatever its content (a bad file's only way out)."""
        with self.writing(), self.folder("jobs") as fd:
            try:
                os.unlink(_id_name(job_id), dir_fd=fd)
            except FileNotFoundError:
                return False
        return True

    # -- extra files: learned figures, the id counter ------------------------------------------

    def read_extra(self, name: str) -> dict[str, Any] | None:
        with self.folder() as fd:
            try:
                return read_json(fd, name, self.path / name)
            except QueueError:
                return None  # a bad learned file is re-learned, never trusted

    def write_extra(self, name: str, data: dict[str, Any]) -> None:
        with self.writing(), self.folder() as fd:
            _write(fd, name, data)

    # -- attempts: live records, results, logs ---------------------------------------------------

    def start_live(self, name: str, payload: dict[str, Any]) -> _records.Held:
        with self.folder("live") as fd:
            return _records.create(fd, self.path / "live", name, payload)

    def inherited_live(self, name: str, fd: int) -> _records.Held:
        """The live record ``name`` its creator (the runner) handed down as descriptor ``fd``:
        its lock, held since before this process existed, is this process's from now on."""
        return _records.Held(self.path / "live", name, io.FileIO(fd, "r+"))

    def update_live(self, held: _records.Held, payload: dict[str, Any]) -> None:
        with self.folder("live") as fd:
            _records.replace(fd, held, payload)

    def end_live(self, held: _records.Held) -> None:
        with self.folder("live") as fd:
            _records.release(fd, held)

    def live(self, name: str) -> tuple[bool, bool, dict[str, Any] | None]:
        """(exists, held by a live process, content) of a live record."""
        with self.folder("live") as fd:
            for seen in _records.scan(fd, self.path / "live"):
                if seen.name == name:
                    mine = seen.owner == os.geteuid()
                    return True, seen.alive and mine, seen.data if mine else None
        return False, False, None

    def live_records(self) -> dict[str, tuple[bool, dict[str, Any] | None]]:
        """Every live record of this user's: name -> (held by a live process, content)."""
        with self.folder("live") as fd:
            return {
                s.name: (s.alive, s.data)
                for s in _records.scan(fd, self.path / "live")
                if s.owner == os.geteuid()
            }

    def drop_live(self, name: str) -> None:
        with self.folder("live") as fd, contextlib.suppress(FileNotFoundError):
            if not _records.is_locked(fd, name):
                os.unlink(name, dir_fd=fd)

    def write_result(self, job_id: int, attempt: int, data: dict[str, Any]) -> None:
        with self.folder("results") as fd:
            _write(fd, f"{job_id}-{attempt}.json", data)

    def read_result(self, job_id: int, attempt: int) -> dict[str, Any] | None:
        name = f"{job_id}-{attempt}.json"
        with self.folder("results") as fd:
            try:
                return read_json(fd, name, self.path / "results" / name)
            except QueueError as exc:
                return {"returncode": None, "detail": str(exc), "unreadable": True}

    def drop_result(self, job_id: int, attempt: int) -> None:
        with self.folder("results") as fd, contextlib.suppress(FileNotFoundError):
            os.unlink(f"{job_id}-{attempt}.json", dir_fd=fd)

    def open_log(self, job_id: int) -> int:
        """The job's log, for appending (O_NOFOLLOW, this user's, 0600)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        with self.folder("logs") as fd:
            try:
                log = os.open(f"{job_id}.log", flags, FILE_MODE, dir_fd=fd)
            except OSError as exc:
                raise QueueError(f"log of job {job_id}: {_why(exc)}") from None
            try:
                _check_file(log, self.path / "logs" / f"{job_id}.log")
            except QueueError:
                os.close(log)
                raise
            return log

    def read_log(self, job_id: int, limit: int) -> tuple[bytes, int]:
        """(the last ``limit`` bytes of the job's log, its size); (b"", 0) when none."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with self.folder("logs") as fd:
            try:
                log = os.open(f"{job_id}.log", flags, dir_fd=fd)
            except FileNotFoundError:
                return b"", 0
            except OSError as exc:
                raise QueueError(f"log of job {job_id}: {_why(exc)}") from None
            try:
                size = _check_file(log, self.path / "logs" / f"{job_id}.log")
                os.lseek(log, max(0, size - limit), os.SEEK_SET)
                return os.read(log, limit), size
            finally:
                os.close(log)

    # -- the runner's record ---------------------------------------------------------------------

    def runners(self) -> list[dict[str, Any]]:
        """The records of this user's live runners."""
        with self.folder("runner") as fd:
            seen = _records.scan(fd, self.path / "runner")
        return [s.data for s in seen if s.alive and s.data is not None]

    def hold_runner(self, payload: dict[str, Any]) -> _records.Held:
        """Become this user's runner; QueueError when another one runs (it would run the same
        jobs twice)."""
        from memgov._ledger.ledger import new_record_name

        with self.writing():
            for other in self.runners():
                raise QueueError(
                    f"a queue runner already runs your queue (pid {other.get('pid')}, "
                    f"{other.get('what', 'memgov queue')}); one runner per user runs it: "
                    "submit with `memgov queue add`, or stop that one first"
                )
            with self.folder("runner") as fd:
                for seen in _records.scan(fd, self.path / "runner"):
                    if not seen.alive:
                        _records.remove_dead(fd, seen)
                return _records.create(fd, self.path / "runner", new_record_name(), payload)

    def release_runner(self, held: _records.Held) -> None:
        with self.folder("runner") as fd:
            _records.release(fd, held)


def _number(name: str) -> int | None:
    stem = name.removesuffix(".json")
    return int(stem) if name.endswith(".json") and stem.isdigit() and len(stem) < 12 else None


def _write(fd: int, name: str, data: dict[str, Any]) -> None:
    raw = json.dumps(data, indent=1, sort_keys=True).encode()
    if len(raw) > MAX_BYTES:
        raise QueueError(f"{name}: {len(raw)} bytes, more than a queue file holds ({MAX_BYTES})")
    try:
        _flock.write_atomic(fd, name, raw, mode=FILE_MODE)
    except OSError as exc:
        raise QueueError(f"cannot write {name} in your queue: {_why(exc)}") from None


def read_json(fd: int, name: str, where: Path) -> dict[str, Any] | None:
    """A file's JSON content (bounded, this user's, never via a symlink); None when missing;
    QueueError saying why when it is not good."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        file_fd = os.open(name, flags, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise QueueError(f"queue file {where}: {_why(exc)}; move it away") from None
    try:
        _check_file(file_fd, where)
        raw = os.read(file_fd, MAX_BYTES + 1)
    finally:
        os.close(file_fd)
    data, problem = _decode(raw)
    if data is None:
        raise QueueError(
            f"queue file {where} is not memgov's ({problem}); it is left as it is: move it "
            "away, or `memgov queue cancel ID` removes a job's file"
        )
    return data


def _decode(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    if len(raw) > MAX_BYTES:
        return None, f"larger than {MAX_BYTES} bytes"
    data, problem = _parse.load_bounded(raw)
    if problem is not None:
        return None, problem
    if not isinstance(data, dict):
        return None, "not a JSON object"
    return data, ""


def _check_file(fd: int, where: Path) -> int:
    """The size of the open file ``fd``; QueueError when it is not a regular file of this user's
    (the caller closes ``fd`` either way)."""
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a regular file"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to uid {info.st_uid}, not you"
    if problem:
        raise QueueError(f"queue file {where}: {problem}; memgov leaves it as it is")
    return info.st_size


def _why(exc: OSError) -> str:
    return "a symlink (not followed)" if exc.errno == errno.ELOOP else str(exc.strerror or exc)


__all__ = ["LedgerError", "Store"]
