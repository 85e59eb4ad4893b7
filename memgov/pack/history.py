"""Measured peaks of finished jobs, so ``memgov pack --claim auto`` can size the next claim.

    $MEMGOV_DIR/v1/_history/<experiment>-<framework>-b<batch>.json

Each file holds the last :data:`KEEP` whole-process peaks (NVML, CUDA context included) of jobs
that finished cleanly under a memgov budget (never greedy runs: a framework's preallocation is not
a need, and never rogue jobs). The auto size is ``max(peaks) * 1.10 + 64 MiB``, rounded up to a
whole MiB: the largest recent peak, plus 10 % for run-to-run variation (allocator rounding,
fragmentation, a cuDNN algorithm that needs a larger workspace), plus 64 MiB for memory the driver
maps late. Files are written like ledger records: a temporary file in the same folder, fsync,
``os.replace``; nothing is ever opened through a symlink. A lock file serialises writers.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

from memgov import _config, _records
from memgov._errors import LedgerError
from memgov._sizes import format_size

FOLDER = ("v1", "_history")
"""``_history``: a name no device folder can take (simulated names start with a letter or
digit, real ones with "GPU-")."""
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
    with _folder() as folder:
        lock = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                       dir_fd=folder)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = _read(folder, name)
            now = time.time()
            kept.extend({"bytes": int(p), "time": now, **info} for p in peaks)
            kept = kept[-KEEP:]
            _write(folder, name, {"version": 1, "key": name, "peaks": kept})
            return kept
        finally:
            os.close(lock)


def _write(folder: int, name: str, payload: dict[str, Any]) -> None:
    data = json.dumps(payload, indent=1, sort_keys=True).encode()
    tmp = f"{_records.TMP_PREFIX}{name}-{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644, dir_fd=folder)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.replace(tmp, name + ".json", src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.fsync(folder)


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
