"""How busy the cores are now: what a thread share may start at and grow into.

The share (memgov/_cpu/threads.py) divides the usable cores among the governed processes it can see.
Two moments it cannot see enough at:

- **A burst of starts.** 25 jobs launched together register one after another while all of
  them import their frameworks; the first ones to register see few neighbours and would start
  at 16, 8, 5 ... threads on a host whose cores are all busy already (OpenMP workers spinning
  at their barriers against 24 interpreters importing torch). :func:`runnable_elsewhere` reads
  how many threads are runnable on the host at that instant (/proc/loadavg's "running" count,
  one read, no interval to wait for), and the first share is at most the cores left.
- **Cores given back.** When neighbours end, the share grows; their DataLoader workers, test
  passes and teardown may still hold the cores. :class:`IdleMeter` measures the idle time of
  the process's own cores between two looks of the follower (/proc/stat, per CPU), and the
  share grows only into cores that were idle, for up to memgov._cpu.threads.GROW_WITHIN_S: then
  all the way (cores busy with work memgov does not govern must not hold it back for good).

Neither ever lowers a share below what the governed processes' count gives, and neither is
used where it would mislead: the host-wide running count only when the process may run on
every online CPU (a pinned or cpuset-limited process would count other CPUs' work), and
nothing at all where /proc cannot be read (the share alone then, as before).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
STAT = Path("/proc/stat")


def runnable_elsewhere(cpus: frozenset[int], loadavg: Path = LOADAVG) -> int | None:
    """Threads runnable on the host right now besides the caller, or None when that is not known
    or not about ``cpus`` (the affinity mask leaves out some online CPU).

    /proc/loadavg's fourth field is "running/total" scheduling entities; "running" counts the
    reading thread itself.
    """
    online = os.cpu_count()
    if online is None or len(cpus) < online:
        return None
    try:
        running = loadavg.read_text().split()[3].split("/")[0]
        return max(0, int(running) - 1)
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class IdleMeter:
    """Idle cores among ``cpus`` between two calls of :meth:`idle_cores` (idle and iowait time
    over all time, per CPU, from /proc/stat)."""

    cpus: frozenset[int]
    stat: Path = STAT
    readable: bool = True
    """False once /proc/stat could not be read (nothing to measure with)."""
    _last: dict[int, tuple[int, int]] | None = field(default=None, repr=False)

    def idle_cores(self) -> float | None:
        """Core-equivalents idle since the previous call; None on the first call (or after
        :meth:`forget`) and when /proc/stat cannot be read (then :attr:`readable` is False)."""
        now = self._read()
        self.readable = now is not None
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        idle = 0.0
        for cpu, (idle_now, total_now) in now.items():
            before = last.get(cpu)
            if before is None or total_now <= before[1]:
                continue
            idle += (idle_now - before[0]) / (total_now - before[1])
        return idle

    def forget(self) -> None:
        """The next call starts a new interval (a stale one says nothing about now)."""
        self._last = None

    def _read(self) -> dict[int, tuple[int, int]] | None:
        try:
            text = self.stat.read_text()
        except OSError:
            return None
        found: dict[int, tuple[int, int]] = {}
        for line in text.splitlines():
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *values = line.split()
            try:
                cpu = int(name[3:])
                ticks = [int(v) for v in values[:8]]  # user .. steal; guest time is inside user
            except ValueError:
                continue
            if cpu in self.cpus and len(ticks) >= 5:
                found[cpu] = (ticks[3] + ticks[4], sum(ticks))
        return found or None
