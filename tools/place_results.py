"""Place raw results by machine: results/DATE-MACHINE-NAME.EXT -> results/MACHINE/DATE-NAME.EXT.

    python tools/place_results.py            # move every flat results file, rewrite references
    python tools/place_results.py --dry-run  # only say what it would move and rewrite
    python tools/place_results.py --index    # also rewrite results/README.md, the index

A benchmark writes its output under a flat name (the machine in the name is what a reader needs
when the file is shown alone); this script files it by machine with ``git mv`` and rewrites every
reference to the old name in the tree's text files (docs, benchmarks, tests, memgov, examples),
including brace and wildcard forms such as ``results/2026-11-23-h200-threads-{torch,jax}.txt``.
Run it again after a branch adds flat files: files already placed are left alone.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
DATE = r"\d{4}-\d\d-\d\d"
MACHINE = r"cpu-\d+core|[a-z]\d{2,3}(?:-x\d+)?"
"""Machines as named in results: cpu-2core (this CPU host), h200, h100, h200-x2 (GPU count)."""
FLAT = re.compile(rf"^(?P<date>{DATE})-(?P<machine>{MACHINE})-(?P<name>.+)$")
FLAT_LINK = re.compile(rf"\bresults/(?P<date>{DATE})-(?P<machine>{MACHINE})-")
"""A reference to a flat file, up to the start of its name (so braces and globs survive)."""
BARE = re.compile(rf"(?<![\w/-])(?P<date>{DATE})-(?P<machine>{MACHINE})-(?P<name>[\w.{{}},*-]+)")
"""A flat name written without its folder (in prose next to a results/ link)."""
TEXT = {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".yml", ".yaml"}
EXAMPLES = ("tools/place_results.py", "tests/test_layout.py")
SKIP = {".git", "results", "build", "dist", "out", "pack-results", "node_modules"}


def placed(name: str) -> Path | None:
    """Where a flat results file goes (None for a name that carries no date and machine)."""
    match = FLAT.match(name)
    if match is None:
        return None
    return RESULTS / match["machine"] / f"{match['date']}-{match['name']}"


def flat_files() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_file() and placed(p.name) is not None)


def text_files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(part in SKIP or part.startswith(".") for part in rel[:-1]):
            continue
        if path.is_file() and (path.suffix in TEXT or path.name == "Dockerfile"):
            found.append(path)
    for example in EXAMPLES:  # their flat names are examples, on purpose
        found.remove(ROOT / example)
    return [*found, RESULTS / "HISTORY.md"]  # the figures by date, the one text kept in results/


def rewrite(text: str) -> str:
    """Every reference to a flat results name, pointed at its placed name."""
    text = FLAT_LINK.sub(lambda m: f"results/{m['machine']}/{m['date']}-", text)

    def bare(match: re.Match[str]) -> str:
        return f"{match['machine']}/{match['date']}-{match['name']}"

    # Bare names only where they name a results file (not dates in prose such as "2026-11-21").
    return BARE.sub(lambda m: bare(m) if _names_result(m) else m[0], text)


def _names_result(match: re.Match[str]) -> bool:
    stem = f"{match['date']}-{match['machine']}-{match['name']}".split("{")[0].split("*")[0]
    return any(name.startswith(stem) for name in _flat_names())


def _flat_names() -> list[str]:
    """Every results file under its flat name (DATE-MACHINE-NAME), placed or not."""
    names = []
    for path in RESULTS.rglob("*"):
        if path.parent == RESULTS:
            names.append(path.name)
        elif path.is_file():
            date, _, name = path.name[:10], path.name[10], path.name[11:]
            names.append(f"{date}-{path.parent.name}-{name}")
    return names


LINK = re.compile(r"(?<!\w)results/[\w.{},*/-]+")
WHAT = {"docs": "doc", "benchmarks": "script", "tests": "test", "README.md": "doc"}


def expand(pattern: str) -> list[str]:
    """A reference's brace alternatives: a-{b,c}.txt -> a-b.txt, a-c.txt."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for alt in match[1].split(",") for name in expand(head + alt + tail)]


def named_by() -> dict[str, set[str]]:
    """Each results file (relative path) -> the text files whose references match it."""
    files = sorted(p.relative_to(ROOT).as_posix() for p in RESULTS.rglob("*") if p.is_file())
    found: dict[str, set[str]] = {f: set() for f in files}
    for path in text_files():
        where = path.relative_to(ROOT).as_posix()
        for ref in LINK.findall(path.read_text(encoding="utf-8")):
            for pattern in expand(ref.rstrip(".,:;")):
                for name in fnmatch.filter(files, pattern):
                    found[name].add(where)
    found.pop("results/README.md", None)
    found.pop("results/HISTORY.md", None)
    return found


def _stem(name: str) -> str:
    """A name without its extension, a gzipped file's too (a.json.gz -> a)."""
    return name.removesuffix(".gz").rsplit(".", 1)[0]


def companion(name: str, found: dict[str, set[str]]) -> str | None:
    """The named file this one is raw data of: the same stem, or a stem this one extends
    (DATE-threads-ab.txt names DATE-threads-ab-mainA.json, its run's JSON)."""
    stem = _stem(name)
    for other, by in sorted(found.items(), key=lambda item: -len(item[0])):
        other_stem = _stem(other)
        if by and other != name and (stem == other_stem or stem.startswith(other_stem + "-")):
            return other
    return None


def write_index() -> list[str]:
    """results/README.md: every file, by machine, with what names it; returns the unnamed."""
    found = named_by()
    lines = [INDEX_HEAD]
    unnamed = []
    for machine in sorted({Path(f).parent.name for f in found}):
        lines += [f"\n## {machine}\n", "| file | named by |", "|---|---|"]
        for name in sorted(f for f in found if Path(f).parent.name == machine):
            by = ", ".join(sorted(found[name]))
            if not by:
                other = companion(name, found)
                by = f"raw data of {Path(other).name}" if other else "nothing"
                if other is None:
                    unnamed.append(name)
            lines.append(f"| [{Path(name).name}]({Path(name).relative_to('results')}) | {by} |")
    (RESULTS / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return unnamed


INDEX_HEAD = """# Raw results, by machine

Every figure in docs/ links to its raw file here; results/HISTORY.md is the measurement history
(which command, which machine, when). Files are `results/MACHINE/DATE-NAME.EXT`:
MACHINE is `cpu-2core` (the 2-core CPU host, shared with other sessions), `h200` (one NVIDIA
H200, 143,771 MiB, 16 cores) or `h100`; DATE is the day of the run. A benchmark writes a flat
name, `results/DATE-MACHINE-NAME.EXT`; `python tools/place_results.py --index` files it here,
points every reference at the new path and rewrites this index (generated: do not edit by hand).
"Named by" lists the docs, scripts and tests that link the file; "raw data of" a file that one of
them links (the JSON of a printed table)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would change, change nothing"
    )
    parser.add_argument("--index", action="store_true", help="rewrite results/README.md too")
    args = parser.parse_args(argv)
    moves = [(p, placed(p.name)) for p in flat_files()]
    for old, new in moves:
        assert new is not None
        print(f"{old.relative_to(ROOT)} -> {new.relative_to(ROOT)}")
        if not args.dry_run:
            new.parent.mkdir(exist_ok=True)
            subprocess.run(["git", "-C", str(ROOT), "mv", str(old), str(new)], check=True)
    for path in text_files():
        text = path.read_text(encoding="utf-8")
        changed = rewrite(text)
        if changed != text:
            print(f"rewrote references in {path.relative_to(ROOT)}")
            if not args.dry_run:
                path.write_text(changed, encoding="utf-8")
    if args.index and not args.dry_run:
        unnamed = write_index()
        for name in unnamed:
            print(f"named by nothing: {name} (link it from the doc it serves, or delete it)")
        return 1 if unnamed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
