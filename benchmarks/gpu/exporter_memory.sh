#!/usr/bin/env bash
# Where the exporter's memory goes beside `memgov pack --n 140` on one GPU (docs/metrics.md,
# "Memory"): the exporter (`memgov exporter`, as users start it, in a session of its own)
# scraped 100 times once CLAIMS claims hold, then its RSS, PSS, USS and a per-mapping breakdown
# (benchmarks/common/smaps.py: the interpreter, libraries, libnvidia-ml.so, malloc arenas, thread
# stacks, Python's object arenas); then the same with `--release-nvml` (NVML shut down after each
# refresh); and NVML's share measured step by step in a fresh interpreter
# beside the same load (benchmarks/gpu/nvml_memory.py), with the exporter's MALLOC_ARENA_MAX=1
# and with glibc's default. One device call, about 5 minutes:
#   bash benchmarks/gpu/verify.sh exporter_memory     (or: bash benchmarks/gpu/exporter_memory.sh)
# Raw output in $OUT (or ./out): three JSON files and pack.log (pack's report stays in /tmp, so
# that the files fit what a device call brings back); the last lines printed sum them up.
# prometheus_client must be importable: carry .whl as for benchmarks/gpu/exporter_scrape.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MEMGOV_DIR=/tmp/memgov-exporter-memory
N=${N:-140}
CLAIMS=${CLAIMS:-120}  # pack's host gate may keep some of the 140 waiting: measure once 120 hold

. benchmarks/gpu/exporter_install.sh  # memgov and prometheus_client

# Is compiled bytecode cached for the libraries the exporter imports, before anything runs? A
# module without it is compiled from source at import, which leaves the heap larger (pynvml:
# 12.5 MiB on the CPU machine, docs/metrics.md, "Memory").
bytecode=$(python3 - <<'PYC'
import importlib.util, os, sys
for name in ("pynvml", "psutil", "prometheus_client", "memgov._status"):
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec else None
    cached = origin and os.path.exists(importlib.util.cache_from_source(origin))
    print(f"bytecode cache: {name}: {'cached' if cached else 'NOT cached'} ({origin})")
print(f"bytecode cache: sys.dont_write_bytecode={sys.dont_write_bytecode}")
PYC
)
echo "$bytecode"
# The jobs run long enough for the measurements; timeout passes INT on to pack, which stops its
# jobs and its MPS daemons.
timeout -s INT --kill-after=30 420 python3 -m memgov pack --n "$N" --mps on --runner preload \
  --epochs 30 --out /tmp/exporter-memory-pack mnist >"$OUT/pack.log" 2>&1 &
pack=$!
uptime
timeout --kill-after=10 270 setsid python3 benchmarks/cpu/exporter_scrape.py --wait-claims "$CLAIMS" \
  --scrapes 100 --exporter-args= --exporter-args=--release-nvml --out "$OUT/exporter-memory-n$N.json"
rc=$?
uptime
for arenas in 1 default; do
  echo "== nvml_memory.py, MALLOC_ARENA_MAX=$arenas"
  if [ "$arenas" = default ]; then unset MALLOC_ARENA_MAX; else export MALLOC_ARENA_MAX=$arenas; fi
  timeout --kill-after=10 60 python3 benchmarks/gpu/nvml_memory.py --readings 10 \
    --out "$OUT/nvml-memory-arenas-$arenas.json"
done
unset MALLOC_ARENA_MAX
uptime
kill -INT "$pack" 2>/dev/null
for _ in $(seq 60); do kill -0 "$pack" 2>/dev/null || break; sleep 1; done
kill -KILL "$pack" 2>/dev/null
wait "$pack" 2>/dev/null
python3 -m memgov mps stop >>"$OUT/pack.log" 2>&1
echo "exporter_memory rc=$rc; pack: $(tail -n 3 "$OUT/pack.log" | tr '\n' ' ' | cut -c1-300)"
python3 benchmarks/gpu/exporter_memory_summary.py "$OUT" "$N"
echo "$bytecode" | sed 's/ (.*)$//'
[ "$rc" = 0 ]
