"""The settings the ledger and admission use, resolved for a device (the parsing is
memgov/_base/settings.py's: every error names its variable)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from memgov._base import settings as _settings
from memgov._base.settings import DEFAULT_CONTEXTS, DEFAULT_DIR, DEFAULT_RESERVE_REAL, SHARED_DIR

__all__ = [
    "DEFAULT_CONTEXTS",
    "DEFAULT_DIR",
    "DEFAULT_RESERVE_REAL",
    "LOCK_TIMEOUT_S",
    "SHARED_DIR",
    "context_limit",
    "ledger_dir",
    "reserve",
]

LOCK_TIMEOUT_S = 30.0
"""A claim's bound on one holder of a device's admission lock: a holder that is stopped, or that
neither ran nor waited for a CPU through a whole bound, fails the claim; claims taking the lock in
turn on a busy host do not (memgov/_files/flock.py, AdmissionLock; docs/ledger.md, "Bounds")."""


def ledger_dir() -> Path:
    """MEMGOV_DIR; unset, the shared set-up's folder where root made it, else the default."""
    folder: Path = _settings.get("MEMGOV_DIR")
    if not _settings.is_set("MEMGOV_DIR") and root_made(Path(SHARED_DIR)):
        return Path(SHARED_DIR)
    return folder


def root_made(folder: Path) -> bool:
    """A folder root owns that no one else may write (the shared set-up's, docs/ledger.md):
    never one another user made first, or a link. Everything on its path is checked again when
    it is used (memgov/_files/trust.py)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022


def reserve(total: int, simulated: bool) -> int:
    """Bytes kept out of every device's budget (MEMGOV_RESERVE: a size or a percentage)."""
    setting = _settings.get("MEMGOV_RESERVE")
    if setting is None:
        return 0 if simulated else DEFAULT_RESERVE_REAL
    if setting == 0:
        return 0
    return int(setting.on(total))


def context_limit(simulated: bool) -> int | None:
    """MEMGOV_CONTEXTS: claims without MPS per GPU; default 72 on a real GPU, None: no limit."""
    setting = _settings.get("MEMGOV_CONTEXTS")
    if setting is None:
        return None if simulated else DEFAULT_CONTEXTS
    return int(setting) or None  # 0: off
