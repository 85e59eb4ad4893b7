#!/usr/bin/env bash
# memgov pack on a fresh machine: each pack starts with a new, empty MEMGOV_DIR (no history, no
# profiles), with pack's defaults (runner, claim, MPS, host gate all chosen by pack), --n 140 and
# --n 25 in one call. Reports (report.json, the summary) go to $OUT.
#   bash benchmarks/gpu/fresh_pack.sh            (EPOCHS=2 by default; N_LIST="140 25")
# With EXPORTER=1, benchmarks/cpu/exporter_scrape.py starts memgov's exporter once 120 of the first
# pack's jobs hold claims and times 100 scrapes (figures beside NVML's: docs/metrics.md) into
# $OUT/exporter_scrape.json; prometheus_client must be importable (benchmarks/gpu/
# exporter_scrape.sh says how to carry its wheel).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
EPOCHS=${EPOCHS:-2}
first=1
for n in ${N_LIST:-140 25}; do
  fresh=$(mktemp -d /tmp/memgov-fresh-XXXXXX)
  export MEMGOV_DIR=$fresh/ledger
  scraper=
  if [ "$first" = 1 ] && [ "${EXPORTER:-0}" = 1 ]; then
    python3 -c "import prometheus_client" 2>/dev/null || python3 -m pip install -q --no-index \
      --find-links .whl prometheus_client >/tmp/exporter_install.log 2>&1
    timeout 400 python3 benchmarks/cpu/exporter_scrape.py --wait-claims 120 --scrapes 100 \
      --out "$OUT/exporter_scrape.json" >"$OUT/exporter_scrape.log" 2>&1 &
    scraper=$!
  fi
  echo "=== memgov pack --n $n --epochs $EPOCHS mnist (fresh MEMGOV_DIR=$MEMGOV_DIR), $(date -u +%T)"
  free -g | head -2
  t0=$SECONDS
  python3 -m memgov pack --n "$n" --epochs "$EPOCHS" --no-progress --out "$fresh/report" \
    experiments/mnist >"$OUT/pack_n$n.txt" 2>&1
  rc=$?
  echo "rc=$rc, $((SECONDS - t0)) s"; cat "$OUT/pack_n$n.txt"
  cp "$fresh/report/report.json" "$OUT/pack_n${n}_report.json" 2>/dev/null
  python3 - "$fresh/report/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("runner", r.get("runner"), "|", r.get("runner_why"))
for run in r["runs"]:
    gate = run.get("host_gate") or {}
    print(run["label"], "ok", run.get("ok"), "failed", run.get("failed"), run.get("reasons"),
          "most at once", gate.get("most_running"), "waited", gate.get("jobs_that_waited"),
          "per_job", gate.get("per_job_mib"), gate.get("source"))
PY
  [ -n "$scraper" ] && { wait "$scraper"; tail -5 "$OUT/exporter_scrape.log"; }
  first=0
done
