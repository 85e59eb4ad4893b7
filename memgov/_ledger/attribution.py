"""Who uses the device memory NVML reports: claimed processes, or processes outside memgov.

NVML reports host PIDs. A process in the host's PID namespace can map each one to a claim through
/proc (the namespace inode and the innermost PID in NSpid), so from the host the attribution is
exact, also for claims made inside containers. Inside a PID namespace, NVML's PIDs mean nothing, so
memgov assumes unattributed use belongs to claims up to their budgets (which memgov itself caps) and
counts only the rest as used outside memgov. docs/ledger.md discusses what that can miss.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

HOST_PIDNS = 0xEFFFFFFC
"""Inode of the kernel's initial PID namespace (PROC_PID_INIT_INO); fixed by Linux."""


def pidns_of(pid: int | str = "self") -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def identity(pid: int) -> tuple[int | None, int | None]:
    """(PID namespace, PID in it) of a host PID: how the ledger tells claim holders apart."""
    return pidns_of(pid), _inner_pid(pid)


def _inner_pid(pid: int) -> int | None:
    """The PID a process has in its own (innermost) namespace, read from the host's /proc."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return pid


@dataclass(frozen=True)
class Holder:
    key: str
    bytes: int
    pid: int
    pidns: int | None


@dataclass(frozen=True)
class Attribution:
    use: dict[str, int | None]
    """Claim key -> bytes its process uses now, or None where it cannot be seen."""
    outside: int
    """Bytes used on the device by processes that hold no claim (plus the driver's own)."""


def attribute(
    used: int, holders: Iterable[Holder], processes: dict[int, int | None] | None
) -> Attribution:
    holders = list(holders)
    use: dict[str, int | None] = {h.key: None for h in holders}
    if processes is not None and pidns_of() == HOST_PIDNS:
        by_identity: dict[tuple[int | None, int | None], str] = {
            (h.pidns, h.pid): h.key for h in holders
        }
        for key in use:
            use[key] = 0  # seen from the host: a claim with no NVML entry uses nothing yet
        for pid, used_bytes in processes.items():
            found = by_identity.get(identity(pid))
            if found is None:
                continue
            previous = use[found]
            use[found] = None if used_bytes is None or previous is None else previous + used_bytes
    # A claim's use up to its budget is inside the budget; what exceeds it, or whose use is unknown
    # and cannot be told apart, is handled as documented above.
    inside = 0
    for holder in holders:
        seen = use[holder.key]
        inside += holder.bytes if seen is None else min(holder.bytes, seen)
    return Attribution(use, max(0, used - inside))
