#!/usr/bin/env bash
# The job queue on a GPU (docs/queue.md): a 30-job mix under several policies, one device call.
#   bash benchmarks/gpu/queue_checks.sh MIX [POLICY ...]     (verify.sh: queue_light, queue_random,
#                                                             queue_policies)
# MIX: light or random (benchmarks/queue/make_mixes.py writes it, seeded); POLICY: any of
# the decision core's policies (memgov/decide/policies.py; default: sjf-exclusive memgov).
# sjf-exclusive runs first: one job at a time, shortest first, the baseline, and its report is the
# solo reference (--solo) of every other policy. memgov runs next, then the rest in the order
# given while time allows; a policy that cannot finish in what is left is skipped, saying so.
#
# MEMGOV_DIR state (printed with the results): sjf-exclusive starts from an empty MEMGOV_DIR
# (each kind's first run gets memgov's first-run size, docs/profiles.md). Every other policy
# starts from a new MEMGOV_DIR holding only what sjf-exclusive learned, the same copy for each:
# the profiles (v1/_profiles: each kind's peak) and the queue's learned solo times
# (v1/_queue/<uid>/learned.json). Warm, as a lab's second day is; no policy learns from another.
# Each policy also gets a fresh copy of the mix's job folders (same seed, same jobs).
#
# Environment:
#   OUT              where reports and logs go ($PWD/out)
#   QUEUE_BUDGET_S   seconds for the whole script (520: the device tool allows 600 a call)
#   QUEUE_SEED       the mix's seed (0); QUEUE_JOBS: jobs in the mix (30)
#   QUEUE_MIX_ARGS   more make_mixes.py options (e.g. "--claims measured --measured FILE")
#   QUEUE_SOLO       an earlier sjf-exclusive report of the same mix: used as the solo
#                    reference, and sjf-exclusive is not run again (a second call)
#   QUEUE_PROFILES   with QUEUE_SOLO: that run's queue_MIX_state.tar.gz (the learned state)
#   PYTHON           the interpreter (python3)
#   QUEUE_COLD=1     no baseline: every policy from an empty MEMGOV_DIR (a first day), no solo
#                    reference (makespan and mean JCT only)
#   QUEUE_MPS=1      start `memgov mps start` before the runs (hard limits), stop it after
#   QUEUE_MAX_SLOWDOWN  e.g. 1.5: one more run, the last, `--policy memgov --max-slowdown
#                    1.5` (its report queue_MIX_memgov-max1.5.json; the measured p90 slowdown
#                    needs the solo reference, so not with QUEUE_COLD=1)
# Files in $OUT (the device tool returns 8 at most): queue_MIX_POLICY.json (each report),
# queue_MIX_logs.tar.gz (the mix file, every run's output, every job's log),
# queue_MIX_state.tar.gz (what sjf-exclusive learned: QUEUE_PROFILES for a later call).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
MIX=${1:-}
shift || true
case $MIX in light|random) ;; *)
  echo "queue_checks.sh: MIX '$MIX': accepted light or random, then policies" >&2; exit 2 ;;
esac
KNOWN="sjf-exclusive memgov fifo tetris bestfit fifo-exclusive gpupacking fgd random"
asked=("$@"); [ ${#asked[@]} -eq 0 ] && asked=(sjf-exclusive memgov)
for p in "${asked[@]}"; do
  case " $KNOWN " in *" $p "*) ;; *)
    echo "queue_checks.sh: policy '$p': accepted $KNOWN" >&2; exit 2 ;;
  esac
done
SOLO=${QUEUE_SOLO:-}
if [ -n "$SOLO" ] && [ ! -f "$SOLO" ]; then
  echo "queue_checks.sh: QUEUE_SOLO=$SOLO: no such file (an sjf-exclusive report)" >&2; exit 2
fi
# The order: the baseline (unless QUEUE_SOLO gives it), memgov if asked, the others as asked.
order=()
[ -z "$SOLO" ] && [ "${QUEUE_COLD:-0}" != 1 ] && order+=(sjf-exclusive)
case " ${asked[*]} " in *" memgov "*) order+=(memgov) ;; esac
for p in "${asked[@]}"; do
  case " ${order[*]} sjf-exclusive " in *" $p "*) ;; *) order+=("$p") ;; esac
done
[ -n "${QUEUE_MAX_SLOWDOWN:-}" ] && order+=("memgov-max${QUEUE_MAX_SLOWDOWN}")
BUDGET=${QUEUE_BUDGET_S:-520}
WORK=$(mktemp -d /tmp/memgov-queue-XXXXXX)
PY=${PYTHON:-python3}
MEMGOV=("$PY" -m memgov)
STATE=$OUT/queue_${MIX}_state.tar.gz
echo "== queue $MIX: policies ${order[*]}; budget $BUDGET s; work folder $WORK; $(date -u +%T)"
if [ "${QUEUE_COLD:-0}" = 1 ]; then
  echo "MEMGOV_DIR state: every policy from an empty MEMGOV_DIR (cold), no baseline"
elif [ -z "$SOLO" ]; then
  echo "MEMGOV_DIR state: sjf-exclusive from an empty MEMGOV_DIR${QUEUE_PROFILES:+ + $QUEUE_PROFILES};" \
       "every other policy from a copy of what it learned (profiles + the queue's learned solo times)"
else
  echo "MEMGOV_DIR state: every policy from ${QUEUE_PROFILES:-an empty MEMGOV_DIR (no QUEUE_PROFILES: cold)};" \
       "solo reference and baseline: $SOLO (an earlier call)"
fi
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null

fresh_mix() {  # fresh_mix DIR: the mix's file and job folders, the same for every policy
  rm -rf "$1"
  local data=()  # MNIST's files, written once, then linked
  [ -d "$WORK/mix-first/data/MNIST/raw" ] && data=(--data "$WORK/mix-first/data")
  # shellcheck disable=SC2086
  "$PY" benchmarks/queue/make_mixes.py "$1" --mix "$MIX" --seed "${QUEUE_SEED:-0}" \
    --jobs "${QUEUE_JOBS:-30}" "${data[@]}" ${QUEUE_MIX_ARGS:-}
}

learned_state() {  # learned_state DIR TAR: profiles and learned solo times of MEMGOV_DIR DIR
  (cd "$1" && tar -czf "$2" v1/_profiles $(ls -d v1/_queue/*/learned.json 2>/dev/null)) \
    || echo "(no learned state under $1)"
}

restore_state() {  # restore_state TAR DIR
  mkdir -p "$2"; [ -f "$1" ] && tar -xzf "$1" -C "$2"
}

[ "${QUEUE_MPS:-0}" = 1 ] && { "${MEMGOV[@]}" mps start || echo "memgov mps start failed"; }
fresh_mix "$WORK/mix-first" >"$WORK/mix.json" || { cat "$WORK/mix.json"; exit 1; }
cat "$WORK/mix.json"
cp "$WORK/mix-first/$MIX.toml" "$WORK/$MIX.toml"
baseline_s=${SOLO:+$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['makespan_s'])" "$SOLO")}
for policy in "${order[@]}"; do
  left=$((BUDGET - SECONDS))
  need=30  # memgov runs unless hopeless; the others only if they can finish in what is left
  if [ "$policy" != sjf-exclusive ] && [ -n "$baseline_s" ]; then
    share=0.6; [ "$policy" = memgov ] && share=0.3
    [ "${policy%-exclusive}" != "$policy" ] && share=1.05
    need=$("$PY" -c "print(int($share * $baseline_s) + 20)")
  fi
  if [ "$left" -lt "$need" ]; then
    echo "=== $policy: skipped, $left s left (needs about $need s)"; continue
  fi
  mixdir=$WORK/mix-$policy
  fresh_mix "$mixdir" >/dev/null || { echo "=== $policy: make_mixes failed"; continue; }
  export MEMGOV_DIR=$WORK/memgov-$policy
  rm -rf "$MEMGOV_DIR"
  if [ "$policy" = sjf-exclusive ]; then
    [ -n "${QUEUE_PROFILES:-}" ] && restore_state "$QUEUE_PROFILES" "$MEMGOV_DIR"
  elif [ -f "$STATE" ]; then
    restore_state "$STATE" "$MEMGOV_DIR"
  elif [ -n "${QUEUE_PROFILES:-}" ]; then
    restore_state "$QUEUE_PROFILES" "$MEMGOV_DIR"
  fi
  solo=()
  [ "$policy" != sjf-exclusive ] && [ -n "$SOLO" ] && solo=(--solo "$SOLO")
  choice=(--policy "$policy")
  case $policy in memgov-max*) choice=(--policy memgov --max-slowdown "${policy#memgov-max}") ;; esac
  report=$OUT/queue_${MIX}_${policy}.json
  echo "=== $policy (MEMGOV_DIR=$MEMGOV_DIR, ${solo[*]:-no solo reference}), $(date -u +%T), $left s left"
  t0=$SECONDS
  timeout --kill-after=15 $((left - 10)) "${MEMGOV[@]}" queue run "${choice[@]}" \
    --out "$report" "${solo[@]}" "$mixdir/$MIX.toml" >"$WORK/run-$policy.log" 2>&1
  rc=$?
  echo "rc=$rc, $((SECONDS - t0)) s"; tail -n 45 "$WORK/run-$policy.log"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "$policy: cut at the time limit (its report, if any, says interrupted)"
  mkdir -p "$WORK/logs/$policy"
  cp -r "$MEMGOV_DIR"/v1/_queue/*/logs "$WORK/logs/$policy/" 2>/dev/null
  if [ "$policy" = sjf-exclusive ] && [ -f "$report" ]; then
    learned_state "$MEMGOV_DIR" "$STATE"
    # a baseline cut short (an interrupted report) would make every ratio look good: none then
    if "$PY" -c "import json,sys; sys.exit(bool(json.load(open(sys.argv[1])).get('interrupted')))" \
        "$report"; then
      SOLO=$report
      baseline_s=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['makespan_s'])" "$report")
    else
      echo "sjf-exclusive was cut short: no baseline, no solo reference for the others"
    fi
  fi
  rm -rf "$mixdir"  # checkpoints and images: gigabytes over a few runs
done
[ "${QUEUE_MPS:-0}" = 1 ] && "${MEMGOV[@]}" mps stop
cp "$WORK"/run-*.log "$WORK/mix.json" "$WORK/$MIX.toml" "$WORK/logs/" 2>/dev/null
tar -czf "$OUT/queue_${MIX}_logs.tar.gz" -C "$WORK" logs
echo; echo "== queue $MIX, $(date -u +%T)"
reports=("$OUT"/queue_"${MIX}"_*.json)
case " ${reports[*]} " in *" $SOLO "*) ;; *) [ -n "$SOLO" ] && reports+=("$SOLO") ;; esac
"$PY" "$REPO/benchmarks/queue/summarize.py" --mix "$MIX" "${reports[@]}"
