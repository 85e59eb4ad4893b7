#!/usr/bin/env bash
# Density past the MPS client cap on the GPU machine, in one device call (< 9 min): the table of
# docs/hard-limits.md (48/96/140 jobs on 1/2/3 MPS servers, 48/96 without MPS), pack --runner preload:
#   bash benchmarks/gpu/mps_density.sh "$OUT"
# Raw JSON: $OUT/mps_density.json; a short table is printed last (benchmarks/gpu/mps_density.py
# says what each step does). ONLY="wall hostmem nomps140q": just those steps (a second
# call for what the budget cut). DRY=1: the same script on a machine without a GPU (tiny CPU
# packs, a stand-in MPS control program): checks the script, not the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-$PWD/out}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-500}  # steps start only while their worst case fits; install + table after
DRY_FLAG=()
if [ "${DRY:-0}" = 1 ]; then
  DRY_FLAG=(--dry-run)
else
  # The trainers need memgov's auto-enable hook (a .pth file): an editable install puts it there.
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "memgov install failed"; tail -20 "$OUT/install.log"; exit 1; }
fi
timeout --kill-after=20 $((BUDGET + 45)) "$PY" benchmarks/gpu/mps_density.py --out "$OUT" \
  --budget "$BUDGET" --only "${ONLY:-}" "${DRY_FLAG[@]}"
rc=$?
echo "mps_density rc=$rc"
exit $rc
