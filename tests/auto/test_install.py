"""The .pth reaches site-packages with `pip install .` and `pip install -e .` (fresh venvs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memgov import _autoenable

REPO = Path(__file__).resolve().parents[2]


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def pip(venv: Path, *args: str) -> None:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr[-3000:]}")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path


def started(venv: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGOV_")}
    env["MEMGOV_CLAIM"] = "1GiB"
    code = "import sys; m = sys.modules.get('memgov._autoenable'); print(m and m._state)"
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
        timeout=60, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_pth_installed_runs_and_is_removed(venv, editable):
    pth = site_packages(venv) / _autoenable.PTH_NAME
    pip(venv, "install", "--no-deps", *(["-e"] if editable else []), str(REPO))
    assert pth.is_file()
    line = pth.read_text()
    assert line.startswith("import os;") and line.count("\n") == 1
    assert set(re.findall(r"'([A-Z_]+)'", line)) == set(_autoenable.TRIGGERS)
    # The .pth wakes auto-enable (its import hooks only: nothing else is imported).
    assert started(venv) == "{'started': True, 'fired': False}"
    pip(venv, "uninstall", "-y", "memgov")
    assert not pth.exists()
    assert started(venv) == "None"
