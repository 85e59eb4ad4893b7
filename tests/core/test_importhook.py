"""memgov/_base/importhook.py: code run right before a module's code, and right after it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
import sys
sys.path.insert(0, {folder!r})
from memgov._base import importhook as _importhook

events = []


def before(module):
    events.append(("before", module.__name__, hasattr(module, "VALUE"),
                   _importhook.imported("fakefw")))
    # Registered while the import runs: waits for its end.
    _importhook.when_imported("fakefw", lambda m: events.append(("after", m.VALUE)))


_importhook.when_importing("fakefw", before)
import fakefw
events.append(("imported", _importhook.imported("fakefw")))
late = []
_importhook.when_importing("fakefw", lambda m: late.append(m.VALUE))  # too late: runs now
print(events, late)
"""


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fakefw.py").write_text(body)
    code = PROGRAM.format(folder=str(tmp_path))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_before_runs_ahead_of_the_modules_code_and_after_at_its_end(tmp_path: Path) -> None:
    result = run(tmp_path, "import sys\nVALUE = 7\nsys.stdout.write('body ')\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "body [('before', 'fakefw', False, False), ('after', 7), ('imported', True)] [7]"
    )


def test_an_exception_before_the_code_fails_the_import_and_leaves_no_empty_module(
    tmp_path: Path,
) -> None:
    (tmp_path / "fakefw.py").write_text("VALUE = 7\n")
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from memgov._base import importhook as _importhook


def refuse(module):
    raise RuntimeError("refused")


_importhook.when_importing("fakefw", refuse)
try:
    import fakefw
except RuntimeError as exc:
    print("failed:", exc, "fakefw" in sys.modules)
import fakefw
print(fakefw.VALUE)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["failed: refused False", "7"]
