"""The CPU cores this process may really use: its affinity mask and its cgroup's CPU quota.

Thread pools (OpenMP, MKL, OpenBLAS, torch, TensorFlow, XLA) size themselves from the host's core
count or the affinity mask; none reads a container's CPU quota. A container limited to 4 CPUs on
a 64-core host that starts 64 threads per pool is throttled by the kernel and runs slower than
with 4.

Quota sources, the strictest along the process's cgroup path wins (a parent's limit binds every
child cgroup below it):
- cgroup v2: ``cpu.max`` ("max 100000" or "<quota> <period>") in the process's cgroup and each
  parent up to the mount's root;
- cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: no limit) along the cpu
  controller's path.
The process's cgroup comes from /proc/self/cgroup and the mount points (with their roots: inside a
container the mount's root is the container's own cgroup) from /proc/self/mountinfo.

Why not a library: psutil reads no quota. joblib's vendored loky ``cpu_count()`` reads
``/sys/fs/cgroup/cpu.max`` or the v1 files at ``/sys/fs/cgroup/cpu/`` in the releases checked
(a newer revision also walks v2 parents, never v1 ones), so it misses a v1 quota on the
process's own cgroup below the mount (a batch system's job cgroup, a cgroup made for a test) and
every v1 parent, and joblib would be a whole dependency for ~100 lines. This parser is small
and tested against real cgroups (tests/threads/).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Quota:
    cpus: float
    """CPUs' worth of time per period (1.5 = one and a half cores)."""
    source: str
    """The file it was read from, for `memgov doctor`."""
    key: str
    """Identifies the limiting cgroup across processes (inode of its folder): processes with the
    same key share this quota."""


@dataclass(frozen=True)
class Usable:
    cpus: frozenset[int]
    """The affinity mask."""
    quota: Quota | None

    @property
    def count(self) -> int:
        """Cores' worth of threads: the affinity size, capped by the quota rounded up."""
        count = len(self.cpus)
        if self.quota is not None:
            count = min(count, max(1, math.ceil(self.quota.cpus - 1e-9)))
        return max(1, count)

    def describe(self) -> str:
        text = f"{len(self.cpus)} core(s) in the affinity mask"
        if self.quota is not None:
            text += f", CPU quota {self.quota.cpus:g} ({self.quota.source})"
        else:
            text += ", no CPU quota"
        return text


def usable(proc: Path = Path("/proc/self")) -> Usable:
    """The affinity mask and the strictest CPU quota of this process; never raises for odd
    cgroup files (a quota that cannot be read is treated as none)."""
    try:
        cpus = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = frozenset(range(os.cpu_count() or 1))
    try:
        quota = cgroup_quota(proc)
    except (OSError, ValueError):
        quota = None
    return Usable(cpus or frozenset({0}), quota)


def cgroup_quota(proc: Path = Path("/proc/self")) -> Quota | None:
    """The strictest CPU quota on this process's cgroup path (v2 and v1), or None."""
    memberships = _memberships((proc / "cgroup").read_text())
    found: list[Quota] = []
    for mount_root, mount_point, fstype, options in _mounts((proc / "mountinfo").read_text()):
        if fstype == "cgroup2":
            path = memberships.get("")
            if path is not None:
                found += _walk(mount_root, Path(mount_point), path, _read_v2)
        elif fstype == "cgroup" and "cpu" in options.split(","):
            path = next((p for names, p in memberships.items() if "cpu" in names.split(",")), None)
            if path is not None:
                found += _walk(mount_root, Path(mount_point), path, _read_v1)
    return min(found, key=lambda q: q.cpus) if found else None


def _memberships(text: str) -> dict[str, str]:
    """controllers ("" for v2) -> cgroup path, from /proc/self/cgroup ("ID:controllers:path")."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            result[parts[1]] = parts[2]
    return result


def _mounts(text: str) -> list[tuple[str, str, str, str]]:
    """(root, mount point, fstype, super options) of each cgroup mount in /proc/self/mountinfo."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 4:
            continue
        fstype = fields[dash + 1]
        if fstype in ("cgroup", "cgroup2"):
            root, point = _unescape(fields[3]), _unescape(fields[4])
            mounts.append((root, point, fstype, fields[dash + 3]))
    return mounts


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape") if "\\" in field else field


def _walk(
    mount_root: str, mount_point: Path, cgroup: str, read: Callable[[Path], Quota | None]
) -> list[Quota]:
    """Quotas of the cgroup and each parent that is visible under this mount."""
    root = mount_root.rstrip("/")
    path = cgroup.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        # The process's cgroup is outside this mount's subtree (a mount of another namespace);
        # inside a cgroup namespace the path is already relative, with root "/".
        return []
    relative = path[len(root) :].strip("/")
    parts = [p for p in relative.split("/") if p and p != ".."]
    found = []
    for depth in range(len(parts), -1, -1):
        folder = mount_point.joinpath(*parts[:depth])
        quota = read(folder)
        if quota is not None:
            found.append(quota)
    return found


def _read_v2(folder: Path) -> Quota | None:
    try:
        text = (folder / "cpu.max").read_text().split()
    except OSError:
        return None
    if len(text) < 1 or text[0] == "max":
        return None
    period = int(text[1]) if len(text) > 1 else 100_000
    return _quota(int(text[0]), period, folder / "cpu.max", folder)


def _read_v1(folder: Path) -> Quota | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except OSError:
        return None
    return _quota(quota, period, folder / "cpu.cfs_quota_us", folder)


def _quota(quota: int, period: int, source: Path, folder: Path) -> Quota | None:
    if quota <= 0 or period <= 0:
        return None  # -1 (v1): no limit
    try:
        key = f"{os.stat(folder).st_dev}:{os.stat(folder).st_ino}"
    except OSError:
        key = str(folder)
    return Quota(quota / period, str(source), key)
