"""Tables in the docs that code generates (settings, pack options): the doc shows the output."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def check_shown(doc: Path, begin: str, end: str, generate: Callable[[], str], module: str) -> None:
    """``doc`` holds ``generate()``'s table between its markers, and ``python -m module``
    prints that table (the command the markers name), and nothing on stderr."""
    text = doc.read_text(encoding="utf-8")
    assert begin in text and end in text, f"{doc.name} lost its generated-table markers"
    shown = text[text.index(begin) + len(begin) : text.index(end)]
    assert shown == generate(), (
        f"{doc.name}'s table differs from the code: paste the output of `python -m {module}` "
        "between the markers"
    )
    printed = subprocess.run(
        [sys.executable, "-m", module], capture_output=True, text=True, check=True
    )
    assert printed.stdout == generate() and not printed.stderr
