"""The docs describe the present: every `memgov` command they name exists, nothing is announced
as coming, and install hints name the distribution (memgov-gpu), not the unrelated `memgov`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from memgov.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/**/README.md")])
SOURCES = sorted([*ROOT.glob("memgov/**/*.py"), *ROOT.glob("adapters/**/*.py")])


def _code(text: str) -> list[str]:
    """The fenced blocks and `inline` spans of a markdown text."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    outside = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    return blocks + re.findall(r"`([^`\n]+)`", outside)


def test_every_memgov_command_the_docs_name_exists() -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    unknown = []
    for path in DOCS:
        for code in _code(path.read_text(encoding="utf-8")):
            code = re.sub(r"(^|\s)#[^\n]*", "", code)  # shell comments are prose
            # a command: at the start of a code span or line, after a prompt, $( && | or a
            # column gap (the architecture diagram), never inside a sentence or an output line
            found = re.findall(r"(?:^|[$(&|]\s*|\s{2})memgov ([a-z][a-z-]*)\b", code, re.M)
            for word in found:
                if word not in commands:
                    unknown.append(f"{path.relative_to(ROOT)}: memgov {word}")
    assert not unknown, f"commands are {sorted(commands)}:\n" + "\n".join(unknown)


def test_nothing_is_announced_as_coming() -> None:
    said = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in DOCS
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bcoming\b", line, flags=re.I)
    ]
    assert not said, "docs describe the present:\n" + "\n".join(said)


def test_install_hints_name_the_distribution() -> None:
    """`pip install memgov[...]` installs the unrelated project; ours is memgov-gpu (or a clone's
    folder, ./memgov[...])."""
    wrong = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in [*DOCS, *SOURCES]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"""pip install[^\n]*?(?<![\w./-])['"]?memgov\[""", line)
    ]
    assert not wrong, "\n".join(wrong)


RESULTS_LINK = re.compile(r"(?<![\w:])results/[\w.{},*/-]+")
"""A results path; one after ``COMMIT:`` is a raw file kept out of the tree (`git show` it)."""


def test_every_results_file_the_docs_name_exists() -> None:
    """A figure's raw file is linked as results/MACHINE/DATE-NAME.EXT (braces and * allowed)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from place_results import expand  # a link's braces expand as the tool that files them reads

    missing = []
    for path in [*DOCS, ROOT / "results" / "HISTORY.md"]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for link in RESULTS_LINK.findall(line):
                for name in expand(link.rstrip(".,:;")):
                    if name.rstrip("/") != "results" and not list(ROOT.glob(name)):
                        missing.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert not missing, "no such results file:\n" + "\n".join(missing)


KEPT_OUT = re.compile(r"\b([0-9a-f]{7,40}):(results/[\w./-]+)")


def test_every_raw_file_kept_out_of_the_tree_is_in_its_commit() -> None:
    """``git show COMMIT:results/...`` in the docs names a file that commit holds."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    missing = []
    for path in [*DOCS, ROOT / "results" / "HISTORY.md"]:
        for commit, name in KEPT_OUT.findall(path.read_text(encoding="utf-8")):
            known = ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"]
            if subprocess.run(known, capture_output=True).returncode:
                continue  # a shallow clone has not that commit: nothing to check against
            there = ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{name}"]
            if subprocess.run(there, capture_output=True).returncode:
                missing.append(f"{path.relative_to(ROOT)}: {commit}:{name}")
    assert not missing, "not in the commit named:\n" + "\n".join(missing)


TRACKER = re.compile(r"(?i)\bmust-shows?\b|\bgoals? \d|\bissues? #?\d|\brounds? \d")
"""Words of the project's tracker and of its working rounds: a reader of the docs has neither."""


def test_docs_use_no_tracker_words() -> None:
    """The docs describe the present; the history (rounds, goals) is results/HISTORY.md."""
    said = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in DOCS
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not said, "tracker words outside results/HISTORY.md:\n" + "\n".join(said)
