"""The repository's layout rules hold for files added later too: benchmarks/ by kind, results/ by
machine with an index, every path that text names exists (benchmarks/README.md, results/README.md,
tools/place_results.py and tools/move_benchmarks.py apply the rules)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"cpu", "gpu", "placement", "ray", "queue", "workloads", "common"}
TEXT = [
    *ROOT.glob("*.md"),
    *ROOT.glob("docs/*.md"),
    *ROOT.glob("benchmarks/**/*.py"),
    *ROOT.glob("benchmarks/**/*.sh"),
    *ROOT.glob("benchmarks/**/*.md"),
    *ROOT.glob("tests/**/*.py"),
]


def test_benchmarks_are_filed_by_kind() -> None:
    loose = [p.name for p in (ROOT / "benchmarks").iterdir() if p.name != "README.md"]
    wrong = sorted(name for name in loose if name not in KINDS)
    assert not wrong, f"file these by kind ({sorted(KINDS)}; tools/move_benchmarks.py): {wrong}"


def test_every_benchmarks_path_named_exists() -> None:
    missing = []
    for path in TEXT:
        text = path.read_text(encoding="utf-8")
        for name in re.findall(r"(?<![\w/])benchmarks/[\w./<>{}$-]*[\w>}]", text):
            if not set("<{$") & set(name) and not (ROOT / name).exists():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, "\n".join(sorted(set(missing)))


def test_results_are_filed_by_machine_and_indexed() -> None:
    """A flat results/DATE-MACHINE-NAME file is moved and indexed by tools/place_results.py
    (results/README.md, the index, and results/HISTORY.md, the figures by date, stay on top)."""
    results = ROOT / "results"
    flat = sorted(
        p.name
        for p in results.iterdir()
        if p.is_file() and p.name not in ("README.md", "HISTORY.md")
    )
    assert not flat, f"run `python tools/place_results.py --index` to file: {flat}"
    index = (results / "README.md").read_text(encoding="utf-8")
    files = [p for p in results.rglob("*") if p.is_file() and p.parent != results]
    unindexed = sorted(
        str(p.relative_to(results)) for p in files if f"]({p.relative_to(results)})" not in index
    )
    assert not unindexed, f"run `python tools/place_results.py --index`: {unindexed}"
    assert "| nothing |" not in index, "link these from the doc they serve, or delete them"


@pytest.mark.parametrize(
    "script", sorted((ROOT / "benchmarks").glob("**/*.sh")), ids=lambda p: p.name
)
def test_benchmark_shell_scripts_parse(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_gpu_check_names_existing_files(tmp_path: Path) -> None:
    """benchmarks/gpu/verify.sh's dry listing (VERIFY_DRY=1): every check, nothing missing."""
    verify = ROOT / "benchmarks" / "gpu" / "verify.sh"
    labels = re.findall(r"^\s{4}([a-z_0-9|]+)\)", verify.read_text(encoding="utf-8"), re.M)
    checks = [check for label in labels for check in label.split("|")]
    assert {"env", "torch", "mps", "pack", "gpu"} <= set(checks)
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "VERIFY_DRY": "1"}
    done = subprocess.run(
        ["bash", str(verify), *checks], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "MISSING" not in done.stdout, done.stdout
    assert not any(tmp_path.iterdir())  # a dry listing writes nothing


def test_every_test_folder_is_a_package() -> None:
    """tests/README.md, "Package layout": unique module names for pytest and mypy."""
    tests = ROOT / "tests"
    folders = [tests, *(p for p in tests.rglob("*") if p.is_dir())]
    bare = sorted(
        str(p.relative_to(ROOT))
        for p in folders
        if "__pycache__" not in p.parts
        and any(f.suffix == ".py" for f in p.iterdir())
        and not (p / "__init__.py").exists()
    )
    assert not bare, f"give these an __init__.py (tests/README.md): {bare}"
    helpers = [
        f"{path.relative_to(ROOT)}"
        for path in tests.rglob("*.py")
        if re.search(r"^\s*(from|import) helpers\b", path.read_text(encoding="utf-8"), re.M)
    ]
    assert not helpers, f"import tests.helpers by its full name (tests/README.md): {helpers}"


def test_a_flat_results_name_is_placed_by_its_machine() -> None:
    """What tools/place_results.py does to a file another branch adds under a flat name."""
    sys.path.insert(0, str(ROOT / "tools"))
    import place_results

    results = ROOT / "results"
    placed = place_results.placed
    assert (
        placed("2026-11-25-h100-queue-bench.json") == results / "h100/2026-11-25-queue-bench.json"
    )
    assert placed("2026-11-25-cpu-2core-x.txt") == results / "cpu-2core/2026-11-25-x.txt"
    assert placed("2026-11-25-h200-x2-nccl.txt") == results / "h200-x2/2026-11-25-nccl.txt"
    assert placed("README.md") is None
    text = "`results/2026-11-25-h100-queue-{a,b}.json`, (../results/2026-11-25-cpu-2core-x.txt)"
    assert place_results.rewrite(text) == (
        "`results/h100/2026-11-25-queue-{a,b}.json`, (../results/cpu-2core/2026-11-25-x.txt)"
    )
