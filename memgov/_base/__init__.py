"""The core's ground: errors, sizes, the MEMGOV_* settings table, config, signals, import hooks."""

from __future__ import annotations

import os
from collections.abc import Iterable

ENV_SET_MARK = "MEMGOV_ENV_SET"
"""Names of the variables memgov set in this process or a governed parent, comma-separated:
`memgov doctor` shows them apart from the user's."""


def note_env_set(names: Iterable[str]) -> None:
    """Add ``names`` to the variables marked as set by memgov (inherited by children)."""
    marked = set(filter(None, os.environ.get(ENV_SET_MARK, "").split(",")))
    added = set(names) - marked - {ENV_SET_MARK}
    if added:
        os.environ[ENV_SET_MARK] = ",".join(sorted(marked | added))
