#!/usr/bin/env bash
# The ledger's churn beside floods (benchmarks/cpu/ledger_churn_floods.py), this tree against an
# earlier one, alternated, as root (the benchmark drops its processes to uids of their own).
#   bash benchmarks/cpu/floods_ab.sh BEFORE_DIR OUT_DIR [BUDGET_S]
# BEFORE_DIR: a copy of an earlier tree's memgov/ and adapters/ (`git archive REV memgov adapters
# | tar -x -C DIR`), first on PYTHONPATH for the "before" runs (this tree for the "after" ones). Runs before-1, after-1,
# before-2, after-2, ... while the next one fits BUDGET_S (default 480 s; each run is expected to
# take as long as the longest so far); then the summary of every report. Raw reports and the
# step-by-step breakdowns (--breakdown) go to OUT_DIR. FLOODS_ARGS replaces the run's size
# (default: --seconds 20 --claimers 16 --kill-every 0.2, what docs/ledger.md quotes).
set -uo pipefail
cd "$(dirname "$0")/../.."
before=${1:?BEFORE_DIR}; out=${2:?OUT_DIR}; budget=${3:-480}
[ -d "$before/memgov" ] || { echo "$before holds no memgov/ (git archive REV memgov adapters)"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark's processes take uids of their own"; exit 2; }
mkdir -p "$out"
# The benchmark's processes run as other uids: they read the earlier tree from a copy they can reach.
copy=$(mktemp -d /tmp/memgov-floods-before-XXXXXX)
trap 'rm -rf "$copy"' EXIT
cp -r "$before/." "$copy/" && chmod -R a+rX "$copy"
start=$SECONDS longest=130 reports=()
for round in 1 2 3 4; do
  for side in before after; do
    if (( SECONDS - start + longest > budget )); then
      echo "=== $side-$round skipped: $longest s more would pass the budget ($budget s)"
      break 2
    fi
    t0=$SECONDS
    report="$out/floods-$side-$round.json"
    path=$PWD; [ "$side" = before ] && path=$copy  # this tree, or the earlier one
    # shellcheck disable=SC2086  # FLOODS_ARGS: several words
    PYTHONPATH=$path python3 benchmarks/cpu/ledger_churn_floods.py \
      ${FLOODS_ARGS:---seconds 20 --claimers 16 --kill-every 0.2} --json "$report" \
      --breakdown "$out/breakdown-$side-$round" >"$out/floods-$side-$round.log" 2>&1
    rc=$?
    took=$((SECONDS - t0)); (( took > longest )) && longest=$took
    echo "=== $side-$round rc=$rc ${took} s ($(date -u +%H:%M:%S) UTC)"
    (( rc == 0 )) || tail -5 "$out/floods-$side-$round.log"
    [ -f "$report" ] && reports+=("$report")
  done
done
(( ${#reports[@]} )) && python3 benchmarks/cpu/ledger_churn_floods.py --summarize "${reports[@]}"
