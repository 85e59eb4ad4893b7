"""Functions longer than a limit: a figure of how much code no longer fits in a reader's head.

    python tools/function_lengths.py [--over 50] [PATH ...]   # default: memgov

A function's length is its lines from ``def`` to its last line (decorators left out; its
docstring and nested functions counted: a reader reads them too). Prints one line per function
over the limit, longest first (``LINES PATH:LINE NAME``), then the count and the longest.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def lengths(paths: list[Path]) -> list[tuple[int, str]]:
    rows = []
    for root in paths:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    end = node.end_lineno or node.lineno
                    rows.append((end - node.lineno + 1, f"{path}:{node.lineno} {node.name}"))
    return sorted(rows, key=lambda row: (-row[0], row[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--over", type=int, default=50, help="lines (default 50)")
    parser.add_argument("paths", nargs="*", type=Path, default=[Path("memgov")])
    args = parser.parse_args()
    rows = lengths(args.paths)
    over = [(n, where) for n, where in rows if n > args.over]
    for n, where in over:
        print(n, where)
    longest = f"{rows[0][0]} lines, {rows[0][1]}" if rows else "none"
    print(f"{len(over)} of {len(rows)} functions over {args.over} lines; the longest: {longest}")


if __name__ == "__main__":
    main()
