#!/usr/bin/env bash
# The exporter beside `memgov pack --n 140` on one GPU (docs/metrics.md, "Scrape time and memory"):
# 100 scrapes of /metrics timed (p50, p99), the exporter's RSS/USS, its per-GPU figures beside
# NVML's, twice: (1) the exporter and the scraping client in the session of the script that
# started pack, so every one of their threads competes with pack's jobs as an equal (the
# condition of results/h200/2026-11-24-exporter-scrape-n140.*); (2) both in a session of their
# own (setsid), as a service beside a user's jobs (kernel autogroups, or a systemd unit's
# cgroup). One device call, < 9 minutes:
#   bash benchmarks/gpu/verify.sh exporter     (or: bash benchmarks/gpu/exporter_scrape.sh)
# Raw output in $OUT (or ./out). prometheus_client must be importable; the GPU machine has no
# network, so carry its wheel: `pip download --no-deps -d .whl prometheus_client==0.26.0` here,
# carry `.whl` (ignored), and this script installs it from there.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MEMGOV_DIR=/tmp/memgov-exporter-check
N=${N:-140}
CLAIMS=${CLAIMS:-120}  # pack's host gate may keep some of the 140 waiting: scrape once 120 hold

. benchmarks/gpu/exporter_install.sh  # memgov and prometheus_client

# The jobs run long enough for both measurements (each waits until CLAIMS hold their claims).
# timeout passes the INT below on to pack, which stops its jobs and its MPS daemons on Ctrl-C.
timeout -s INT --kill-after=30 480 python3 -m memgov pack --n "$N" --mps on --runner preload \
  --epochs 30 --out "$OUT/pack" mnist >"$OUT/pack.log" 2>&1 &
pack=$!
uptime
timeout --kill-after=10 300 python3 benchmarks/cpu/exporter_scrape.py --wait-claims "$CLAIMS" \
  --scrapes 100 --out "$OUT/exporter-scrape-n$N-same-session.json" 2>&1 \
  | tee "$OUT/exporter-scrape-n$N-same-session.txt"
rc=${PIPESTATUS[0]}
uptime
timeout --kill-after=10 120 setsid python3 benchmarks/cpu/exporter_scrape.py --wait-claims "$CLAIMS" \
  --scrapes 100 --out "$OUT/exporter-scrape-n$N-own-session.json" 2>&1 \
  | tee "$OUT/exporter-scrape-n$N-own-session.txt"
rc2=${PIPESTATUS[0]}
uptime
kill -INT "$pack" 2>/dev/null
for _ in $(seq 60); do kill -0 "$pack" 2>/dev/null || break; sleep 1; done
kill -KILL "$pack" 2>/dev/null
wait "$pack" 2>/dev/null
python3 -m memgov mps stop >>"$OUT/pack.log" 2>&1
echo "exporter_scrape rc=$rc (same session), rc=$rc2 (own session); pack: $(tail -n 3 "$OUT/pack.log" | tr '\n' ' ')"
[ "$rc" = 0 ] && [ "$rc2" = 0 ]
