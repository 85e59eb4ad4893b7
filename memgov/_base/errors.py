"""memgov's exceptions: one hierarchy under :class:`MemgovError`, all importable from ``memgov``.

Every error a user can cause says what was wrong and what is accepted, and is raised where the
problem is found (a bad size by memgov._base.sizes, a bad setting by its row in
memgov._base.settings), so no caller rewords another's error. As psutil does, each class says it is
``memgov.X`` (its ``__module__``): tracebacks, reprs and pickles name the public class, not this
private module. README.md ("Errors") lists them; tests/core/test_errors.py holds the list to the
code.
"""

from __future__ import annotations


class MemgovError(Exception):
    """Base class of every error memgov raises on purpose."""

    __module__ = "memgov"


class ConfigError(MemgovError, ValueError):
    """A size, environment variable or argument memgov cannot use (a ValueError too, so code
    that catches ValueError for a bad argument keeps working)."""

    __module__ = "memgov"
    problem = ""
    """What is wrong with the value, without the setting's name or what is accepted (a size's
    error sets it), for a caller that says both in its own words."""


class LedgerError(MemgovError):
    """The ledger folder cannot be used (permissions, a symlink, a lock that is never released)."""

    __module__ = "memgov"


class LockTimeout(LedgerError):
    """A device's admission lock stayed held past its bound (a stopped or hostile process)."""

    __module__ = "memgov"


class NoDeviceError(MemgovError):
    """No GPU (real or simulated) matches what was asked for."""

    __module__ = "memgov"


class MpsError(MemgovError):
    """The MPS daemon cannot be started, queried or stopped as asked."""

    __module__ = "memgov"


class BudgetExceeded(MemgovError):
    """A claim does not fit in the free budget of its device.

    Carries the facts a scheduler needs to decide what to do next.
    """

    __module__ = "memgov"

    def __init__(
        self,
        message: str,
        *,
        device: str,
        requested: int,
        free: int,
        holders: list[tuple[str, int]] | None = None,
        queued_ahead: int = 0,
    ) -> None:
        super().__init__(message)
        self.device = device
        self.requested = requested
        self.free = free
        self.holders = holders or []
        self.queued_ahead = queued_ahead

    def __reduce__(self) -> tuple[object, ...]:
        # Exceptions pickle as cls(*args): the keyword-only facts must be passed back too, or
        # unpickling (multiprocessing, Ray) fails with a TypeError instead of this error.
        return (_rebuild_budget_exceeded, (str(self), self.__dict__.copy()))


def _rebuild_budget_exceeded(message: str, facts: dict[str, object]) -> BudgetExceeded:
    error = BudgetExceeded.__new__(BudgetExceeded)
    Exception.__init__(error, message)
    error.__dict__.update(facts)
    return error


class ProfileError(LedgerError):
    """A job's profile (its measured peaks) cannot be read or written: a bad or foreign file,
    or a profile folder that is not this user's. Nothing is overwritten or lost."""

    __module__ = "memgov"


class QueueError(LedgerError):
    """The job queue's store cannot be used or holds a bad file (memgov/queue/store.py): a
    folder that is not this user's, a job file that is not one. Nothing is overwritten or lost."""

    __module__ = "memgov"
