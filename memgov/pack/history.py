"""Measured peaks of finished jobs, so ``memgov pack --claim auto`` can size the next claim.

    $MEMGOV_DIR/v1/_history/<experiment>-<framework>-b<batch>.json

Each file holds the last :data:`KEEP` whole-process peaks (NVML, CUDA context included) of jobs
that finished cleanly under a memgov budget (never greedy runs: a framework's preallocation is not
a need, and never rogue jobs). The auto size is ``max(peaks) * 1.10 + 64 MiB``, rounded up to a
whole MiB: the largest recent peak, plus 10 % for run-to-run variation (allocator rounding,
fragmentation, a cuDNN algorithm that needs a larger workspace), plus 64 MiB for memory the driver
maps late. The ledger's modules write the files (``_records.write_atomic``: whole or not at all,
never through a symlink) and lock them (``_flock``: one writer at a time, with the ledger's
timeout, so a stopped process cannot hang a pack).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memgov import _config, _records
from memgov._errors import LedgerError
from memgov._flock import AdmissionLock
from memgov._ledger import VERSION_DIR
from memgov._sizes import format_size

FOLDER = (VERSION_DIR, "_history")
"""``_history``: a name no device folder can take (simulated names start with a letter or
digit, real ones with "GPU-")."""
VERSION = 1
"""Of a history file's content (the folder's version is the ledger's)."""
KEEP = 32
MARGIN_FRACTION = 0.10
MARGIN_BYTES = 64 * 2**20
MAX_BYTES = 64 * 1024
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def key(experiment: str, framework: str, batch: int) -> str:
    return _SAFE.sub("_", f"{experiment}-{framework}-b{batch}")


def margin(peak: int) -> int:
    """The documented auto size for a measured peak (bytes), rounded up to a whole MiB."""
    raw = peak * (1 + MARGIN_FRACTION) + MARGIN_BYTES
    return math.ceil(raw / 2**20) * 2**20


@contextlib.contextmanager
def _folder() -> Iterator[int]:
    with _records.open_dir(_config.ledger_dir(), FOLDER, create=True) as fd:
        yield fd


def read(name: str) -> list[dict[str, Any]]:
    """The recorded peaks of ``name`` (oldest first); [] when there are none or the file is bad."""
    with _folder() as folder:
        return _read(folder, name)


def _read(folder: int, name: str) -> list[dict[str, Any]]:
    try:
        fd = os.open(name + ".json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LedgerError(f"history file {name}.json is a symlink; memgov never follows "
                              "symlinks") from None
        raise LedgerError(f"cannot read history file {name}.json: {exc}") from None
    try:
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return []  # a torn or foreign file: start over rather than fail the pack
    peaks = data.get("peaks") if isinstance(data, dict) else None
    if not isinstance(peaks, list):
        return []
    return [p for p in peaks if isinstance(p, dict) and isinstance(p.get("bytes"), int)
            and not isinstance(p.get("bytes"), bool) and p["bytes"] > 0]


def record(name: str, peaks: list[int], **info: Any) -> list[dict[str, Any]]:
    """Add measured peaks (bytes) of finished jobs; keep the last KEEP. Returns what is kept."""
    if not peaks:
        return read(name)
    with _folder() as folder, AdmissionLock(_lock_path(), _config.LOCK_TIMEOUT_S):
        kept = _read(folder, name)
        now = time.time()
        kept.extend({"bytes": int(p), "time": now, **info} for p in peaks)
        kept = kept[-KEEP:]
        payload = {"version": VERSION, "key": name, "peaks": kept}
        data = json.dumps(payload, indent=1, sort_keys=True).encode()
        _records.write_atomic(folder, name + ".json", data)
        return kept


def _lock_path() -> Path:
    return _config.ledger_dir().joinpath(*FOLDER, ".lock")


def largest(name: str) -> int | None:
    """The largest recorded peak of ``name`` (bytes), or None when nothing is recorded."""
    return max((p["bytes"] for p in read(name)), default=None)


def auto_size(name: str) -> tuple[int, str] | None:
    """(bytes, where they come from) for ``--claim auto``, or None when nothing is recorded."""
    peaks = read(name)
    if not peaks:
        return None
    top = max(p["bytes"] for p in peaks)
    size = margin(top)
    return size, (f"history {name}: largest of {len(peaks)} recorded peak(s) "
                  f"{format_size(top)} x {1 + MARGIN_FRACTION:.2f} + "
                  f"{format_size(MARGIN_BYTES)} = {format_size(size)}")
