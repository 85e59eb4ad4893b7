#!/usr/bin/env bash
# The job queue on a real GPU (docs/queue.md), a smoke check of its GPU paths: NVML samples and
# utilisation, CUDA_VISIBLE_DEVICES, claims in the ledger, profiles sizing `auto`, learned
# slowdowns. 12 torch jobs of 3 kinds (benchmarks/gpu/queue_job.py), sjf-exclusive first (the
# solo reference), then memgov with --solo, then fifo. Not the issue's 30-job benchmark (that one
# is benchmarks' queue workload, another branch). Usage: bash queue_smoke.sh OUT_DIR
set -uo pipefail
OUT=${1:-$PWD/out}; mkdir -p "$OUT"
export MEMGOV_DIR=${MEMGOV_DIR:-/tmp/memgov-queue-smoke}
rm -rf "$MEMGOV_DIR"
JOB="$(cd "$(dirname "$0")" && pwd)/queue_job.py"
FILE="$OUT/queue_smoke.toml"
{
  for i in 0 1 2 3; do
    printf '[[job]]\nname = "small-%s"\nkind = "small"\ncmd = ["python3", "%s", "--mib", "256", "--n", "1024", "--steps", "%s"]\n\n' "$i" "$JOB" $((15000 + i))
    printf '[[job]]\nname = "mid-%s"\nkind = "mid"\ncmd = ["python3", "%s", "--mib", "2048", "--n", "2048", "--steps", "%s"]\n\n' "$i" "$JOB" $((7500 + i))
    printf '[[job]]\nname = "big-%s"\nkind = "big"\ncmd = ["python3", "%s", "--mib", "8192", "--n", "4096", "--steps", "%s"]\n\n' "$i" "$JOB" $((1500 + i))
  done
} >"$FILE"
nvidia-smi --query-gpu=name,memory.total --format=csv
# First runs size each job (profiles); the exclusive run is the solo reference.
python3 -m memgov queue run --policy sjf-exclusive --out "$OUT/queue_sjf.json" "$FILE"; echo "rc=$?"
python3 -m memgov queue run --policy memgov --solo "$OUT/queue_sjf.json" --out "$OUT/queue_memgov.json" \
  --plot "$OUT/queue_memgov.png" "$FILE"; echo "rc=$?"
python3 -m memgov queue run --policy fifo --solo "$OUT/queue_sjf.json" --out "$OUT/queue_fifo.json" "$FILE"; echo "rc=$?"
python3 - "$OUT" <<'PY'
import json, sys
for name in ("sjf", "memgov", "fifo"):
    try:
        r = json.load(open(f"{sys.argv[1]}/queue_{name}.json"))
    except OSError:
        print(name, "no report"); continue
    slow = sorted(j["slowdown"] for j in r["jobs"] if j["slowdown"])
    p90 = slow[int(0.9 * (len(slow) - 1))] if slow else None
    utils = [s["util_pct"] for s in r["samples"] if s["util_pct"] is not None]
    print(f"{name}: makespan {r['makespan_s']:.1f} s, ends {sorted({j['end'] for j in r['jobs']})}, "
          f"ooms {r['ooms']}, killed_by_neighbour {r['killed_by_neighbour']}, p90 slowdown {p90}, "
          f"decisions {r['decisions']}, peak used {max([s['used_bytes'] for s in r['samples']] or [0]) / 2**30:.1f} GiB, "
          f"util samples {len(utils)}")
PY
