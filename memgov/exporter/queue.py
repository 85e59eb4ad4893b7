"""The job queue's metrics: each user's jobs, read from that user's store as memgov queue keeps it.

    $MEMGOV_DIR/v1/_queue/<uid>/jobs/N.json    one job (memgov/queue/store.py)

The exporter reads the job files' ``state`` and arrival (``not_before``) only, with the same rules
as for the counters of memgov._ledger.stats: a ``<uid>`` folder or file that is not that user's, a
symlink, a special file, an oversized or malformed file is skipped and counted as a problem,
never followed or trusted. It does not import memgov.queue: the store's own reader reads the
calling user's store only (every check is against this process's uid), and the serving process
imports no other tool of memgov (docs/metrics.md, "Lean serving process"). The stores are private
(0700): root's exporter sees every user's queue; another user's sees only its own.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field

from memgov._base import config as _config
from memgov._base.errors import LedgerError
from memgov._files import flock as _flock
from memgov._ledger import parse as _parse

PARTS = ("v1", "_queue")
"""memgov/queue/store.py's folder of the users' stores."""
MAX_BYTES = 512 * 1024
"""memgov/queue/store.py's bound on a job file."""
MAX_USERS = 10_000
MAX_JOBS = 100_000
"""Per user, job files read at most (a display bound: the queue itself has none)."""
JOB_NAME = re.compile(r"^[0-9]{1,11}\.json$")
STATES = ("queued", "running", "done", "failed", "cancelled")
"""memgov/queue/model.py's states of a job."""


@dataclass
class UserQueue:
    queued: int = 0
    """Jobs not started yet (state queued)."""
    waiting: int = 0
    """Of those, the ones whose arrival has come: ready, waiting for room on a GPU or a runner."""
    running: int = 0


@dataclass
class Queues:
    users: dict[int, UserQueue] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Why folders or files were skipped: not their user's, not memgov's format, unreadable."""


def read() -> Queues:
    """Every user's queue that this process may read."""
    found = Queues()
    try:
        with _flock.open_dir(_config.ledger_dir(), PARTS, create=False) as fd:
            names = sorted(n for n in os.listdir(fd) if n.isdigit() and len(n) <= 10)
            for name in names[:MAX_USERS]:
                _read_user(fd, int(name), found)
    except FileNotFoundError:
        pass  # no queue was ever used here
    except OSError as exc:
        found.problems.append(f"{'/'.join(PARTS)}: {exc.strerror or exc}")
    except LedgerError as exc:
        found.problems.append(str(exc))
    return found


def _read_user(queue_fd: int, uid: int, found: Queues) -> None:
    where = f"_queue/{uid}"
    # PermissionError: another user's private store, and this exporter is not root: not shown
    user_fd = _owned_folder(str(uid), queue_fd, uid, where, found, PermissionError)
    if user_fd is None:
        return
    try:
        jobs_fd = _owned_folder("jobs", user_fd, uid, f"{where}/jobs", found, FileNotFoundError)
        if jobs_fd is None:
            return
        try:
            queue = found.users.setdefault(uid, UserQueue())
            now = time.time()
            for name in sorted(os.listdir(jobs_fd))[:MAX_JOBS]:
                if JOB_NAME.match(name):
                    _count(jobs_fd, name, uid, now, queue, found, f"{where}/jobs/{name}")
        finally:
            os.close(jobs_fd)
    finally:
        os.close(user_fd)


def _owned_folder(
    name: str, dir_fd: int, uid: int, where: str, found: Queues, unseen: type[OSError]
) -> int | None:
    """``name`` in ``dir_fd`` opened as a folder of ``uid``'s, never through a symlink; None where
    it is not one: quietly for ``unseen``, else with the problem said in ``found``."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except unseen:
        return None
    except OSError as exc:
        hint = " (a symlink or not a folder?)" if unseen is PermissionError else ""
        found.problems.append(f"{where}: {exc.strerror or exc}{hint}")
        return None
    if os.fstat(fd).st_uid == uid:
        return fd
    os.close(fd)
    found.problems.append(f"{where}: not uid {uid}'s folder")
    return None


def _count(
    jobs_fd: int, name: str, uid: int, now: float, queue: UserQueue, found: Queues, where: str
) -> None:
    """Count one job file in ``queue``, or say in ``found.problems`` why it was skipped."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:  # owned by a FileIO at once: no interrupt between open and close leaks it
        file = _flock.open_owned(name, flags, jobs_fd, register=False)
    except FileNotFoundError:
        return  # removed since the listing (`memgov queue cancel`)
    except OSError as exc:
        found.problems.append(f"{where}: {exc.strerror or exc}")
        return
    with file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            found.problems.append(f"{where}: not a regular file")
            return
        if info.st_uid != uid:
            found.problems.append(f"{where}: owned by uid {info.st_uid}, not {uid}")
            return
        raw = os.read(file.fileno(), MAX_BYTES + 1)
    data, why = _parse.load_bounded(raw) if len(raw) <= MAX_BYTES else (None, "too large")
    state = data.get("state") if isinstance(data, dict) and data.get("version") == 1 else None
    arrival = data.get("not_before", 0.0) if isinstance(data, dict) else None
    if state not in STATES or isinstance(arrival, bool) or not isinstance(arrival, (int, float)):
        found.problems.append(f"{where}: not a memgov queue job ({why or 'its fields'})")
        return
    if state == "queued":
        queue.queued += 1
        queue.waiting += arrival <= now
    elif state == "running":
        queue.running += 1
