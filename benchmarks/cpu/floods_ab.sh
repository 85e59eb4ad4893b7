#!/usr/bin/env bash
# The ledger's churn beside floods (benchmarks/cpu/ledger_churn_floods.py) under several
# conditions, alternated, as root (the benchmark drops its processes to uids of their own).
#   bash benchmarks/cpu/floods_ab.sh OUT_DIR BUDGET_S NAME=CODE@FOLDER ...
# Each condition: NAME (the reports' names), CODE `tree` (this tree) or a folder holding an
# earlier tree's memgov/ and adapters/ (`git archive REV memgov adapters | tar -x -C DIR`), first
# on PYTHONPATH; FOLDER where the ledgers are made (--under: /tmp, memgov's default, or a tmpfs).
# Rounds run every condition in turn while the next run fits BUDGET_S (each run is expected to
# take as long as the longest so far); then the summary of every report. Raw reports and each
# run's step-by-step breakdown (--breakdown) go to OUT_DIR/floods-reports.tar.gz. FLOODS_ARGS replaces the
# run's size (default: --seconds 20 --claimers 16 --kill-every 0.2, what docs/ledger.md quotes).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT_DIR}; budget=${2:?BUDGET_S}; shift 2
(( $# )) || { echo "name at least one condition: NAME=CODE@FOLDER (CODE: tree or a folder)"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark's processes take uids of their own"; exit 2; }
mkdir -p "$out"
copies=()
trap 'rm -rf "${copies[@]}"' EXIT
names=() paths=() unders=()
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  code=${rest%@*} under=${rest##*@}
  [[ $name && $code && $under && $spec == *=*@* ]] || { echo "$spec: not NAME=CODE@FOLDER"; exit 2; }
  [ -d "$under" ] || { echo "$spec: no folder $under"; exit 2; }
  if [ "$code" = tree ]; then
    path=$PWD
  else
    [ -d "$code/memgov" ] || { echo "$spec: $code holds no memgov/"; exit 2; }
    # The benchmark's processes run as other uids: they read the earlier tree from a copy.
    path=$(mktemp -d /tmp/memgov-floods-code-XXXXXX); copies+=("$path")
    cp -r "$code/." "$path/" && chmod -R a+rX "$path"
  fi
  echo "condition $name: memgov from $path, ledgers under $under ($(stat -f -c %T "$under"))"
  names+=("$name") paths+=("$path") unders+=("$under")
done
start=$SECONDS longest=100 reports=()
for round in 1 2 3 4 5 6; do
  for i in "${!names[@]}"; do
    name=${names[$i]}-$round
    if (( SECONDS - start + longest > budget )); then
      echo "=== $name skipped: $longest s more would pass the budget ($budget s)"
      break 2
    fi
    t0=$SECONDS
    # shellcheck disable=SC2086  # FLOODS_ARGS: several words
    PYTHONPATH=${paths[$i]} python3 benchmarks/cpu/ledger_churn_floods.py \
      ${FLOODS_ARGS:---seconds 20 --claimers 16 --kill-every 0.2} --under "${unders[$i]}" \
      --json "$out/floods-$name.json" --breakdown "$out/breakdown-$name" \
      >"$out/floods-$name.log" 2>&1
    rc=$?
    took=$((SECONDS - t0)); (( took > longest )) && longest=$took
    echo "=== $name rc=$rc ${took} s ($(date -u +%H:%M:%S) UTC)"
    (( rc == 0 )) || tail -5 "$out/floods-$name.log"
    [ -f "$out/floods-$name.json" ] && reports+=("$out/floods-$name.json")
  done
done
(( ${#reports[@]} )) && python3 benchmarks/cpu/ledger_churn_floods.py --summarize "${reports[@]}"
# One file, not dozens: what comes back from the device machine is limited in number of files
# (a call there returned 8 of 14). Unpack with tar -xzf.
names=$(cd "$out" && ls -d floods-* breakdown-* 2>/dev/null)
[ -n "$names" ] && tar -czf "$out/floods-reports.tar.gz" -C "$out" $names \
  && (cd "$out" && rm -rf $names)
