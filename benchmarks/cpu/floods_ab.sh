#!/usr/bin/env bash
# The ledger's churn beside floods (benchmarks/cpu/ledger_churn_floods.py) under several
# conditions, alternated, as root (the benchmark drops its processes to uids of their own).
#   bash benchmarks/cpu/floods_ab.sh OUT_DIR BUDGET_S NAME=CODE@FOLDER ...
# Each condition: NAME (letters, digits, . _ -: the reports' names), CODE `tree` (this tree) or a
# folder holding an earlier tree's memgov/ and adapters/ (`git archive REV memgov adapters | tar
# -x -C DIR`), first on PYTHONPATH; FOLDER where the ledgers are made (--under: /tmp, memgov's
# default, or a tmpfs; no `@` in it). Relative paths are the caller's. A round runs every
# condition once, and starts only if the whole round fits BUDGET_S (each run taken to last as
# long as the longest so far). After each run every report so far (raw JSON, log, the
# step-by-step breakdown) is in OUT_DIR/floods-reports.tar.gz (one file: what comes back from
# the device machine is limited in number of files); the summary of all is printed last. Exit
# status: how many runs failed. FLOODS_ARGS replaces the run's size (default: --seconds 20
# --claimers 16 --kill-every 0.2, what docs/ledger.md quotes).
set -uo pipefail
out=${1:?OUT_DIR}; budget=${2:?BUDGET_S}; shift 2
(( $# )) || { echo "name at least one condition: NAME=CODE@FOLDER (CODE: tree or a folder)"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark's processes take uids of their own"; exit 2; }
mkdir -p "$out" && out=$(realpath "$out") || exit 2
tree=$(realpath "$(dirname "$0")/../..")
staging=$(mktemp -d /tmp/memgov-floods-runs-XXXXXX)  # the loose files, outside OUT_DIR
copies=()
trap 'rm -rf "$staging" "${copies[@]}"' EXIT
names=() paths=() unders=()
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  code=${rest%@*} under=${rest##*@}
  [[ $spec == *=*@* && $name =~ ^[A-Za-z0-9._-]+$ && -n $code && -n $under ]] \
    || { echo "$spec: not NAME=CODE@FOLDER (NAME of letters, digits, . _ -)"; exit 2; }
  [ -d "$under" ] || { echo "$spec: no folder $under"; exit 2; }
  under=$(realpath "$under")
  if [ "$code" = tree ]; then
    path=$tree
  else
    [ -d "$code/memgov" ] || { echo "$spec: $code holds no memgov/"; exit 2; }
    # The benchmark's processes run as other uids: they read the earlier tree from a copy.
    path=$(mktemp -d /tmp/memgov-floods-code-XXXXXX); copies+=("$path")
    cp -r "$code/." "$path/" && chmod -R a+rX "$path" || { echo "$spec: cannot copy $code"; exit 2; }
  fi
  echo "condition $name: memgov from $path, ledgers under $under ($(stat -f -c %T "$under"))"
  names+=("$name") paths+=("$path") unders+=("$under")
done
cd "$tree" || exit 2
start=$SECONDS longest=100 reports=() failed=0
for round in 1 2 3 4 5 6; do
  if (( SECONDS - start + longest * ${#names[@]} > budget )); then
    echo "=== round $round skipped: ${#names[@]} runs of $longest s would pass the budget ($budget s)"
    break
  fi
  for i in "${!names[@]}"; do
    name=${names[$i]}-$round
    t0=$SECONDS
    # shellcheck disable=SC2086  # FLOODS_ARGS: several words
    PYTHONPATH=${paths[$i]} python3 benchmarks/cpu/ledger_churn_floods.py \
      ${FLOODS_ARGS:---seconds 20 --claimers 16 --kill-every 0.2} --under "${unders[$i]}" \
      --json "$staging/floods-$name.json" --breakdown "$staging/breakdown-$name" \
      >"$staging/floods-$name.log" 2>&1
    rc=$?
    took=$((SECONDS - t0)); (( took > longest )) && longest=$took
    echo "=== $name rc=$rc ${took} s ($(date -u +%H:%M:%S) UTC)"
    (( rc == 0 )) || { failed=$((failed + 1)); tail -5 "$staging/floods-$name.log"; }
    [ -f "$staging/floods-$name.json" ] && reports+=("$staging/floods-$name.json")
    tar -czf "$out/floods-reports.tar.gz.new" -C "$staging" . \
      && mv "$out/floods-reports.tar.gz.new" "$out/floods-reports.tar.gz"
  done
done
(( ${#reports[@]} )) && python3 benchmarks/cpu/ledger_churn_floods.py --summarize "${reports[@]}"
exit "$failed"
