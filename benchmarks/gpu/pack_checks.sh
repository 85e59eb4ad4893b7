#!/usr/bin/env bash
# `memgov pack`'s checks 1-5 on the GPU machine, in about 6 minutes.
#   bash benchmarks/gpu/pack_checks.sh "$OUT"        (verify.sh runs it as its "pack" check)
# Every check is one real `memgov pack` call; its full report.json goes into ONE merged file,
# $OUT/pack_checks.json (with the command, exit status and wall time of each), plus the plot of
# check 1 as $OUT/pack_checks.png. Everything else is written under a temporary folder and removed.
# A short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-$PWD/out}}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/memgov-pack-checks.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# One fresh ledger for the whole script: check 1 records measured peaks that later `--claim auto`
# calls read (the history round trip).
export MEMGOV_DIR=$WORK/ledger MEMGOV_DATA_CACHE=$WORK/data-cache PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
MNIST=experiments/mnist
BUDGET=${PACK_BUDGET_S:-390}  # verify.sh stops this script at 420 s; the merge must run before
# SMOKE=1: the same script on a CPU machine with tiny jobs (checks the script, not the GPU).
if [ "${SMOKE:-0}" = 1 ]; then N25=2 N48=3 N3=2 NDENSE=4 L=256 DEV="--device cpu"; else
  N25=25 N48=48 N3=3 NDENSE=140 L=; DEV=; fi
lim() { [ -n "$L" ] && echo "$L" || echo "$1"; }
: >"$WORK/checks.tsv"

check() {  # check NAME SHELL_LIMIT_S PACK_ARGS...: one pack call, its report kept in $WORK/NAME
  local name=$1 limit=$2; shift 2
  # ONLY="name ...": run just those checks (e.g. a second device call for what did not fit).
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local t0=$SECONDS left=$((BUDGET - SECONDS))
  if [ "$left" -lt 20 ]; then echo "=== $name: skipped, ${left}s of the budget left"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name: memgov pack $*"
  # shellcheck disable=SC2086
  timeout --kill-after=10 "$limit" "$PY" -m memgov pack --out "$WORK/$name" --no-progress $DEV \
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" $((SECONDS - t0)) "$*" >>"$WORK/checks.tsv"
  tail -n 22 "$WORK/$name.out"; tail -n 4 "$WORK/$name.err"
  echo "--- $name: rc=$rc in $((SECONDS - t0)) s"
}

# 1. n=25 torch, claim + MPS + governed threads, beside a naive baseline (framework defaults, no
#    thread or MPS governance) in the same invocation. The baseline trains 1,500 images per job
#    (it is ~10x slower); both figures are rates measured while all 25 jobs ran.
#    5 epochs (the study's setup): the window in which all 25 train outlasts their start-up stagger.
check ms1_n25_torch 200 --n $N25 --framework torch --mode claim --epochs 5 --timeout 120 \
  --baseline naive --baseline-args "--epochs 1 --limit $(lim 1500)" $MNIST \
  -- --eval-limit 1000 ${L:+--limit $L}
# 2. n=48 without MPS (time-slicing), threads governed: where does it stop? (capacity block)
check ms2_n48_nomps 100 --n $N48 --mps off --epochs 1 --no-solo --timeout 80 $MNIST \
  -- --limit "$(lim 4000)" --eval-limit 500
# 3. JAX greedy (the study: 75 % preallocated per job) vs JAX with a claim per job.
check ms3a_jax_greedy 60 --n $N3 --framework jax --mode greedy --epochs 1 --no-solo \
  --timeout 45 $MNIST -- --limit "$(lim 5000)" --eval-limit 500
check ms3b_jax_claim 100 --n $N25 --framework jax --mode claim --claim 1GiB --epochs 2 --no-solo \
  --timeout 80 $MNIST -- --eval-limit 500 --limit "$(lim 20000)"
# 4. 24 good jobs and 1 rogue that allocates 4 GiB past its budget (claim auto: from check 1's
#    measured peaks).
check ms4_rogue 70 --n $N25 --rogue 1:4096 --epochs 1 --no-solo --timeout 55 $MNIST \
  -- --limit "$(lim 10000)" --eval-limit 500
# 5. One job alone, with a claim vs without (greedy), 3 runs each (--parallel 1: one at a time).
check ms5a_one_claim 45 --n 3 --parallel 1 --mode claim --mps off --epochs 2 --no-solo \
  --timeout 40 $MNIST -- --limit "$(lim 15000)" --eval-limit 500
check ms5b_one_none 45 --n 3 --parallel 1 --mode greedy --epochs 2 --no-solo --timeout 40 \
  $MNIST -- --limit "$(lim 15000)" --eval-limit 500
# 2b. Densest safe packing without MPS (last: the budget cuts it, not the others). More jobs than
#     host memory holds at once: pack's host-memory gate (memgov/pack/hostmem.py, sized from the
#     host USS that checks 1-4 recorded) starts as many as fit and the rest as those end; claims
#     are from --claim auto. The report says how many ran at once and which limit held them.
check ms2b_dense_nomps 150 --n $NDENSE --mps off --epochs 1 --no-solo --timeout 130 $MNIST \
  -- --limit "$(lim 320)" --eval-limit 64

[ -f "$WORK/ms1_n25_torch/plot.png" ] && cp "$WORK/ms1_n25_torch/plot.png" "$OUT/pack_checks.png"
"$PY" - "$WORK" "$OUT/pack_checks.json" <<'EOF'
import json, statistics, sys
from pathlib import Path

work, dest = Path(sys.argv[1]), Path(sys.argv[2])
checks = {}
for line in (work / "checks.tsv").read_text().splitlines():
    name, rc, wall, args = line.split("\t", 3)
    path = work / name / "report.json"
    report = json.loads(path.read_text()) if path.exists() else None
    err = (work / f"{name}.err").read_text(errors="replace").splitlines()[-15:]
    checks[name] = {"args": args, "rc": int(rc), "wall_s": int(wall), "report": report,
                    "stderr_tail": err}

def rep(name):
    return (checks.get(name) or {}).get("report") or {}

def steady(name):
    return [j["steady_epoch_s"] for j in rep(name).get("jobs", []) if j["steady_epoch_s"]]

m1, b1 = rep("ms1_n25_torch"), rep("ms1_n25_torch").get("baseline") or {}
m4 = rep("ms4_rogue")
bad4 = [j for j in m4.get("jobs", []) if j["status"] != "ok"]
c5, n5 = steady("ms5a_one_claim"), steady("ms5b_one_none")
summary = {
    "1_n25_torch": {
        "ok": m1.get("ok"), "n": m1.get("n"),
        "aggregate_samples_per_s": m1.get("aggregate_samples_per_s"),
        "aggregate_samples_per_s_span": m1.get("aggregate_samples_per_s_span"),
        "solo_samples_per_s": m1.get("solo_samples_per_s"), "x_one_job": m1.get("speedup"),
        "baseline_ok": b1.get("ok"), "baseline_aggregate_samples_per_s":
            b1.get("aggregate_samples_per_s"), "baseline_x_one_job": b1.get("speedup"),
        "footprint_mib": m1.get("footprint_mib"), "claim_mib": m1.get("claim_mib"),
        "mps": m1.get("mps"),
    },
    "2_n48_nomps": {k: rep("ms2_n48_nomps").get(k) for k in (
        "ok", "n", "aggregate_samples_per_s", "footprint_max_mib", "device_peak_used_mib",
        "host_uss_peak_mib", "uss_per_job_mib", "capacity")},
    "2b_dense_nomps": {k: rep("ms2b_dense_nomps").get(k) for k in (
        "ok", "n", "reasons", "interrupted", "claim_mib", "footprint_max_mib",
        "device_peak_used_mib", "host_uss_peak_mib", "host_used_peak_mib", "uss_per_job_mib",
        "host", "host_gate", "capacity", "wall_s")},
    "3_jax": {
        "greedy_ok": rep("ms3a_jax_greedy").get("ok"), "greedy_n": rep("ms3a_jax_greedy").get("n"),
        "greedy_footprints_mib": [j["footprint_mib"] for j in rep("ms3a_jax_greedy").get("jobs", [])],
        "greedy_reasons": rep("ms3a_jax_greedy").get("reasons"),
        "greedy_device_peak_used_mib": rep("ms3a_jax_greedy").get("device_peak_used_mib"),
        "claim_ok": rep("ms3b_jax_claim").get("ok"), "claim_n": rep("ms3b_jax_claim").get("n"),
        "claim_footprint_max_mib": rep("ms3b_jax_claim").get("footprint_max_mib"),
        "claim_mib": rep("ms3b_jax_claim").get("claim_mib"),
        "claim_device_peak_used_mib": rep("ms3b_jax_claim").get("device_peak_used_mib"),
    },
    "4_rogue": {"ok": m4.get("ok"), "n": m4.get("n"), "claim": m4.get("claim"),
                "failed": [{k: j[k] for k in ("index", "rogue_mib", "reason", "detail",
                                               "footprint_mib")} for j in bad4]},
    "5_one_job_epoch": {"claim_steady_epoch_s": c5, "none_steady_epoch_s": n5,
                        "ratio_median": (round(statistics.median(c5) / statistics.median(n5), 4)
                                         if c5 and n5 else None)},
}
dest.write_text(json.dumps({"summary": summary, "checks": checks}, indent=1))
print("\n== pack checks (full reports in", dest.name + ")")
for name, c in checks.items():
    r = c["report"] or {}
    print(f"{name:18} rc={c['rc']:<3} {c['wall_s']:>4}s ok={r.get('ok')}/{r.get('n')} "
          f"agg={r.get('aggregate_samples_per_s')} x1={r.get('speedup')} "
          f"foot={r.get('footprint_mib')}/{r.get('footprint_max_mib')} "
          f"dev_peak={r.get('device_peak_used_mib')} reasons={r.get('reasons')}")
print(json.dumps(summary, indent=1)[:3000])
EOF
