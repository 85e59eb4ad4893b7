"""`python -m memgov.exporter --listen HOST:PORT --refresh S [--release-nvml]`: the serving process.

`memgov exporter` checks its options and then replaces itself with this (os.execve, same PID), so
the long-running process imports what serving needs (prometheus_client, memgov's readers, NVML)
and not the command line's libraries (typer, click, rich): docs/metrics.md, "Memory".
"""

from __future__ import annotations

import argparse
import sys

from memgov._base.errors import MemgovError
from memgov.exporter import INSTALL

try:
    from memgov.exporter import serve
except ImportError as exc:  # prometheus_client missing or broken: one line, as the command says
    print(f"memgov: the exporter needs prometheus_client ({exc}): {INSTALL}", file=sys.stderr)
    sys.exit(2)


MIN_REFRESH_S = 0.1
"""As `memgov exporter --refresh` accepts (a smaller one would refresh without pause)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memgov exporter", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default=serve.DEFAULT_LISTEN)
    parser.add_argument("--refresh", type=float, default=serve.DEFAULT_REFRESH_S)
    parser.add_argument("--release-nvml", action="store_true")
    args = parser.parse_args(argv)
    if not args.refresh >= MIN_REFRESH_S:  # also NaN
        parser.error(f"--refresh {args.refresh}: accepted a number of seconds >= {MIN_REFRESH_S}")
    try:
        serve.serve(args.listen, args.refresh, release_nvml=args.release_nvml)
    except MemgovError as exc:
        print(f"memgov: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
