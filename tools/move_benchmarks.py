"""File benchmarks/ by kind: each script moves to the folder of its kind, every reference follows.

    python tools/move_benchmarks.py [--dry-run]

KINDS is the rule (a script's kind is what it needs to run); a script added later at the top of
benchmarks/ gets a row there and the script is run again: it ``git mv``s what is not yet in place,
rewrites ``benchmarks/NAME`` references in the tree's text files and, for a script one folder
deeper than before, its ``parents[1]`` repository root. benchmarks/README.md is the index.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from place_results import ROOT, text_files

BENCHMARKS = ROOT / "benchmarks"
KINDS = {
    # cpu: the ledger, start-up and thread governance, on any machine (no GPU)
    "core_checks.py": "cpu",
    "ledger_fairness.py": "cpu",
    "ledger_latency.py": "cpu",
    "ledger_churn_floods.py": "cpu",
    "claim_beside_flood.py": "cpu",
    "startup.py": "cpu",
    "threads_follow.py": "cpu",
    "threads_honoured.py": "cpu",
    "xla_threads.py": "cpu",
    "preload_cow.py": "cpu",
    "preload_cpu.py": "cpu",
    "exporter_scrape.py": "cpu",
    # ray: memgov.ray on a simulated Ray cluster (CPU)
    "ray_tune_mnist.py": "ray",
    "ray_abort_repro.py": "ray",
    # placement: the cluster simulator on the public traces in placement/data
    "placement_table.py": "placement",
    "placement_variants.py": "placement",
    # workloads: the plain trainers the GPU checks compare memgov against
    "plain_torch_mnist.py": "workloads",
    "plain_jax_mnist.py": "workloads",
    "_plain_common.py": "workloads",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would change, change nothing"
    )
    args = parser.parse_args(argv)
    moved = {name: kind for name, kind in KINDS.items() if (BENCHMARKS / name).exists()}
    for name, kind in moved.items():
        print(f"benchmarks/{name} -> benchmarks/{kind}/{name}")
        if args.dry_run:
            continue
        (BENCHMARKS / kind).mkdir(exist_ok=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "mv", f"benchmarks/{name}", f"benchmarks/{kind}/{name}"],
            check=True,
        )
        script = BENCHMARKS / kind / name
        text = script.read_text(encoding="utf-8")
        deeper = text.replace("resolve().parents[1]", "resolve().parents[2]")
        deeper = deeper.replace("resolve().parent.parent", "resolve().parents[2]")
        script.write_text(deeper, encoding="utf-8")
    # References to every filed script, also those a later branch wrote to its old place.
    filed = {
        name: kind
        for name, kind in KINDS.items()
        if name in moved or (BENCHMARKS / kind / name).exists()
    }
    for path in text_files():
        text = path.read_text(encoding="utf-8")
        changed = text
        for name, kind in filed.items():
            changed = changed.replace(f"benchmarks/{name}", f"benchmarks/{kind}/{name}")
        if changed != text:
            print(f"rewrote references in {path.relative_to(ROOT)}")
            if not args.dry_run:
                path.write_text(changed, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
