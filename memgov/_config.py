"""Settings read from the environment, in one place so every error names its variable."""

from __future__ import annotations

import os
from pathlib import Path

from memgov._errors import ConfigError
from memgov._sizes import parse_size

DEFAULT_DIR = "/tmp/memgov-ledger"
"""Ledger folder when MEMGOV_DIR is unset. One per host: bind-mount it into containers. Not
"/tmp/memgov": Python started in /tmp would import that folder as the memgov package."""

DEFAULT_RESERVE_REAL = 256 * 2**20
"""Kept free on a real GPU beyond what NVML reports used (driver growth, fragmentation)."""

LOCK_TIMEOUT_S = 30.0
"""Longest wait for a device's admission lock; only a stopped (SIGSTOP) process holds it so long."""


def ledger_dir() -> Path:
    raw = os.environ.get("MEMGOV_DIR", "").strip()
    if not raw:
        return Path(DEFAULT_DIR)
    path = Path(raw)
    if not path.is_absolute():
        raise ConfigError(
            f"MEMGOV_DIR={raw!r} must be an absolute path (processes started from other folders "
            "and other containers must find the same ledger)"
        )
    return path


def reserve(total: int, simulated: bool) -> int:
    """Bytes kept out of every device's budget (MEMGOV_RESERVE: a size or a percentage)."""
    raw = os.environ.get("MEMGOV_RESERVE", "").strip()
    if not raw:
        return 0 if simulated else DEFAULT_RESERVE_REAL
    if raw in ("0", "0B", "0%"):
        return 0
    try:
        return parse_size(raw, total=total, what="MEMGOV_RESERVE")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


DEFAULT_CONTEXTS = 72
"""CUDA contexts (processes without MPS) admitted per real GPU. The H200 refused new contexts
with "CUDA error: out of memory" at 76 (256 MiB clients) and at 104 (MNIST jobs), most memory
free; 72 stays under both. Simulated devices have no contexts: no limit unless set."""


def context_limit(simulated: bool) -> int | None:
    """MEMGOV_CONTEXTS: a whole number >= 1, or off; default 72 on a real GPU."""
    raw = os.environ.get("MEMGOV_CONTEXTS", "").strip().lower()
    if not raw:
        return None if simulated else DEFAULT_CONTEXTS
    if raw == "off":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(
            f"MEMGOV_CONTEXTS={os.environ['MEMGOV_CONTEXTS']!r}: accepted a whole number >= 1 "
            f"(claims without MPS per GPU; default {DEFAULT_CONTEXTS} on a real GPU) or off"
        )
    return int(raw)


def flag(name: str) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off/empty; anything else is an error."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name}={os.environ[name]!r}: accepted 1/true/yes/on or 0/false/no/off")
