"""The last lines of benchmarks/gpu/exporter_memory.sh: its JSON files summed up, a line each.

    python3 benchmarks/gpu/exporter_memory_summary.py OUT N

For each exporter run (default, --release-nvml): claims, scrape p99, RSS, PSS, USS, and the
pages of libnvidia-ml.so, of the main malloc heap and of malloc's thread arenas. For each
nvml_memory.py run (MALLOC_ARENA_MAX=1, glibc's default): each step's RSS and USS, and their
growth over the exporter's imports (NVML's share), libnvidia-ml.so's pages, threads and time.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def mib(kb: float) -> str:
    return f"{kb / 1024:.1f}"


def exporter_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for run in runs:
        memory = run["exporter_memory"]
        groups = {g["group"]: g for g in memory["breakdown_kb"]}

        def rss(name: str, key: str = "rss_kb", groups: dict[str, Any] = groups) -> str:
            return mib(groups.get(name, {}).get(key, 0))

        lines.append(
            f"exporter {run['exporter_args'] or '(default)'}: {run['claims_in_last_scrape']} "
            f"claims, p99 {run['latency_ms']['p99']:.2f} ms, the refresh before the body "
            f"{run.get('refresh_s') or 0:.3f} s; "
            f"RSS {memory['rss_mib']:.1f} PSS "
            f"{memory['pss_mib']:.1f} USS {memory['uss_mib']:.1f} MiB; libnvidia-ml.so RSS "
            f"{rss('nvml library (libnvidia-ml.so)')} PSS "
            f"{rss('nvml library (libnvidia-ml.so)', 'pss_kb')}; heap "
            f"{rss('main malloc arena [heap]')}; thread arenas {rss('malloc thread arenas')} MiB"
        )
    return lines


def nvml_lines(arenas: str, steps: list[dict[str, Any]]) -> list[str]:
    base = steps[1]  # the exporter's imports, before pynvml
    lines = []
    for step in steps[2:]:
        took = "" if step["seconds"] is None else f" {step['seconds']:.3f} s"
        lines.append(
            f"  arenas={arenas}: {step['step'][:44]:44} RSS {mib(step['rss_kb'])} "
            f"(+{mib(step['rss_kb'] - base['rss_kb'])}) USS {mib(step['uss_kb'])} "
            f"(+{mib(step['uss_kb'] - base['uss_kb'])}) nvml.so "
            f"{mib(step['nvml_library_rss_kb'])} threads {step['threads']}{took}"
        )
    return lines


def main(out: str, n: str) -> int:
    try:
        with open(f"{out}/exporter-memory-n{n}.json") as f:
            print("\n".join(exporter_lines(json.load(f))))
    except (OSError, ValueError, KeyError) as exc:
        print(f"no exporter figures: {type(exc).__name__}: {exc}")
    for arenas in ("1", "default"):
        try:
            with open(f"{out}/nvml-memory-arenas-{arenas}.json") as f:
                print("\n".join(nvml_lines(arenas, json.load(f)["steps"])))
        except (OSError, ValueError, KeyError) as exc:
            print(f"no NVML figures (arenas={arenas}): {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
