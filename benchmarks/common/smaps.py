"""Where a process's memory is: /proc/PID/smaps_rollup, and /proc/PID/smaps grouped by what maps it.

    rollup(pid)     -> {"Rss": kB, "Pss": kB, "Anonymous": kB, ...} (the kernel's own sums), plus
                       "Uss" = Private_Clean + Private_Dirty
    breakdown(pid)  -> [{"group", "rss_kb", "pss_kb", "uss_kb", "size_kb", "mappings"}],
                       largest first
    show(pid)       -> the two as text, for a report

Groups: the interpreter (python binary, libpython), each other file-backed library by its file's
name (libnvidia-ml.so.* as "nvml library"), Python's extension modules (lib-dynload, summed), other
files (locale archive, ...), device files (/dev/nvidia*), and the anonymous memory: [heap] (the
main malloc arena), "malloc thread arenas" (glibc's per-thread arenas: 64 MiB aligned
reservations of which the touched part is resident), "thread stacks" (a read-write mapping right
above a one-page guard), "anonymous, whole MiB" (CPython's obmalloc arenas are 1 MiB anonymous
mappings in 3.10-3.13; adjacent ones merge with each other or with other mappings), and "other
anonymous" (merged arenas, big buffers, ctypes, libraries' own mmaps). Anonymous mappings are
classified by shape (size, alignment, guard page), a heuristic; the rollup's totals are exact.
Import with ``sys.path.insert(0, str(BENCHMARKS / "common"))`` then ``from smaps import ...``.
"""

from __future__ import annotations

import os
import re
from typing import Any

KB = 1024
PAGE = os.sysconf("SC_PAGE_SIZE")
"""A thread's stack sits right above one guard page (glibc's default guard)."""
MALLOC_HEAP_ALIGN = 64 * 2**20
"""glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's heap is reserved at this alignment."""
_RANGE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


def rollup(pid: int) -> dict[str, int]:
    """The kernel's sums over every mapping of ``pid`` (kB), and Uss = private pages."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                found[parts[0][:-1]] = int(parts[1])
    found["Uss"] = found.get("Private_Clean", 0) + found.get("Private_Dirty", 0)
    return found


def mappings(pid: int) -> list[dict[str, Any]]:
    """Every mapping of ``pid``: start, end, perms, path ("" for anonymous) and its kB fields."""
    found: list[dict[str, Any]] = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = _RANGE.match(line)
            if head:
                start, end = int(head.group(1), 16), int(head.group(2), 16)
                path = head.group(4).strip()
                found.append({"start": start, "end": end, "perms": head.group(3), "path": path})
                continue
            parts = line.split()
            if found and len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                found[-1][parts[0][:-1]] = int(parts[1])
    return found


def _interpreter_files(pid: int) -> set[str]:
    try:
        exe = os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return set()
    return {exe}


def group_of(maps: list[dict[str, Any]], index: int, exe: set[str]) -> str:
    """The group a mapping counts in (module docstring)."""
    m = maps[index]
    path, size = m["path"], m["end"] - m["start"]
    name = os.path.basename(path)
    if path in exe or re.match(r"libpython\d", name):
        return "python interpreter (binary, libpython)"
    if name.startswith("libnvidia-ml.so"):
        return "nvml library (libnvidia-ml.so)"
    if path.startswith("/dev/"):
        return "device files (" + ("/dev/nvidia*" if "nvidia" in path else path) + ")"
    if "/lib-dynload/" in path:
        return "python extension modules (lib-dynload)"
    if path.startswith("/") and (".so" in name):
        return "library " + re.sub(r"\.so[.0-9]*$", ".so", name)
    if path.startswith("/"):
        return "file " + path
    if path == "" and m["perms"] == "---p":
        return "reserved, no access (guard pages, arena reserves)"
    if path in ("[heap]", "[stack]", "[vdso]", "[vvar]", "[vsyscall]"):
        return "main malloc arena [heap]" if path == "[heap]" else path
    return _anonymous_group(maps, index, size)


def _anonymous_group(maps: list[dict[str, Any]], index: int, size: int) -> str:
    m = maps[index]
    prev = maps[index - 1] if index > 0 else None
    after = maps[index + 1] if index + 1 < len(maps) else None
    if m["start"] % MALLOC_HEAP_ALIGN == 0 and (
        size == MALLOC_HEAP_ALIGN
        or (
            after is not None
            and after["path"] == ""
            and after["perms"] == "---p"
            and after["start"] == m["end"]
        )
    ):
        return "malloc thread arenas"
    guarded = (
        prev is not None
        and prev["perms"] == "---p"
        and prev["path"] == ""
        and prev["end"] == m["start"]
        and prev["end"] - prev["start"] == PAGE
    )
    if guarded and m["perms"].startswith("rw"):
        return "thread stacks"
    if size % (1024 * KB) == 0 and m["perms"].startswith("rw"):
        return "anonymous, whole MiB (CPython object arenas, 1 MiB each)"
    return "other anonymous (merged arenas, buffers, libraries' own)"


def breakdown(pid: int) -> list[dict[str, Any]]:
    """Mappings of ``pid`` summed by group, largest RSS first (kB)."""
    maps = mappings(pid)
    exe = _interpreter_files(pid)
    groups: dict[str, dict[str, Any]] = {}
    for index, m in enumerate(maps):
        name = group_of(maps, index, exe)
        g = groups.setdefault(
            name,
            {"group": name, "rss_kb": 0, "pss_kb": 0, "uss_kb": 0, "size_kb": 0, "mappings": 0},
        )
        g["rss_kb"] += m.get("Rss", 0)
        g["pss_kb"] += m.get("Pss", 0)
        g["uss_kb"] += m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)
        g["size_kb"] += (m["end"] - m["start"]) // KB
        g["mappings"] += 1
    return sorted(groups.values(), key=lambda g: (-g["rss_kb"], g["group"]))


def show(pid: int, top: int = 25) -> str:
    """Rollup and breakdown of ``pid`` as text (MiB; groups with RSS, the top ``top``)."""
    r = rollup(pid)
    lines = [
        f"smaps_rollup of {pid}: RSS {r.get('Rss', 0) / KB:.1f} MiB, PSS {r.get('Pss', 0) / KB:.1f}"
        f" MiB, USS {r['Uss'] / KB:.1f} MiB; anonymous {r.get('Anonymous', 0) / KB:.1f} MiB, "
        f"file-backed RSS {(r.get('Rss', 0) - r.get('Anonymous', 0)) / KB:.1f} MiB "
        f"(shared {(r.get('Shared_Clean', 0) + r.get('Shared_Dirty', 0)) / KB:.1f} MiB)",
        f"  {'RSS':>8} {'PSS':>8} {'USS':>8} {'mapped':>9} {'maps':>4}  group (MiB)",
    ]
    rows = [g for g in breakdown(pid) if g["rss_kb"] > 0]
    for g in rows[:top]:
        lines.append(
            f"  {g['rss_kb'] / KB:8.2f} {g['pss_kb'] / KB:8.2f} {g['uss_kb'] / KB:8.2f} "
            f"{g['size_kb'] / KB:9.1f} {g['mappings']:4d}  {g['group']}"
        )
    rest = rows[top:]
    if rest:
        lines.append(
            f"  {sum(g['rss_kb'] for g in rest) / KB:8.2f} {'':8} {'':8} {'':9} {len(rest):4d}"
            "  (the other groups)"
        )
    return "\n".join(lines)


__all__ = ["breakdown", "group_of", "mappings", "rollup", "show"]
