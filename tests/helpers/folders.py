"""Folders as a filesystem keeps them: whether a folder's room stays once its entries go."""

from __future__ import annotations

import os
from pathlib import Path

from memgov._ledger import compact as _compact

_KEEPS_ROOM: dict[int, bool] = {}


def plant(folder: Path, count: int) -> None:
    """``count`` empty files named like records, ``{i:020d}-...``: their names begin 0000."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(count):
            name = f"{i:020d}-{i % 16:012x}.json"
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def keeps_room(base: Path, count: int = 40_000) -> bool:
    """Whether a folder on ``base``'s filesystem stays large enough for gc to rebuild it once
    ``count`` entries have gone (ext4, xfs: yes; tmpfs gives the room back). Asked once."""
    device = os.stat(base).st_dev
    if device not in _KEEPS_ROOM:
        probe = base / f"probe-{os.getpid()}"
        probe.mkdir()
        try:
            plant(probe, count)
            for name in os.listdir(probe):
                os.unlink(probe / name)
            _KEEPS_ROOM[device] = _compact.bloated(os.stat(probe), 0)
        finally:
            probe.rmdir()
    return _KEEPS_ROOM[device]
