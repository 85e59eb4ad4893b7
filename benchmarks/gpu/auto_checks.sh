#!/usr/bin/env bash
# Claims that size themselves (docs/profiles.md, "On a GPU"), both GPU checks in one device call:
#   AUTO_SCRIPTS=DIR bash benchmarks/gpu/auto_checks.sh "$OUT"   (verify.sh runs it as "auto")
# DIR holds the PyTorch examples' unchanged mnist/main.py and dcgan/main.py (github.com/pytorch/
# examples, carried to the GPU machine: it has no network; memgov never copies them). Nothing is
# fetched. Raw JSON: $OUT/auto_checks.json; every job's output is summarised in it. A short table
# is printed last. AUTO_ARGS passes more options to auto_checks.py (e.g. "--per-kind 2").
# SMOKE=1: the same on a CPU machine (simulated GPU, tiny jobs; needs torchvision, transformers).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-$PWD/out}}
mkdir -p "$OUT"
SCRIPTS=${AUTO_SCRIPTS:-}
if [ -z "$SCRIPTS" ] || [ ! -f "$SCRIPTS/mnist/main.py" ] || [ ! -f "$SCRIPTS/dcgan/main.py" ]; then
  echo "AUTO_SCRIPTS='$SCRIPTS' must name a folder with mnist/main.py and dcgan/main.py of the" \
       "PyTorch examples (carried unchanged); see docs/profiles.md, 'On a GPU'" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1
smoke=(); [ "${SMOKE:-0}" = 1 ] && smoke=(--smoke --per-kind 1 --neighbours 1 --beside 2)
# shellcheck disable=SC2086
${PYTHON:-python3} benchmarks/gpu/auto_checks.py --scripts "$SCRIPTS" --out "$OUT/auto_checks.json" \
  --budget "${AUTO_BUDGET_S:-520}" "${smoke[@]}" ${AUTO_ARGS:-}
