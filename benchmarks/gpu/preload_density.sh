#!/usr/bin/env bash
# 140 MNIST jobs at once under MPS with `--runner preload` (jobs forked from one process that
# imported torch once), then, if time is left, the same pack with `--runner process` for
# comparison; one device call (< 9 min):
#   bash benchmarks/gpu/preload_density.sh "$OUT"
# N=96 RUNNERS="preload" LIMIT_S=200: other sizes, runners, time per pack.
# Raw: $OUT/preload-density-<runner>/report.json (pack's full report: per job uss_mib, rss_mib,
# footprint_mib, started_s, epoch spans; the run's `runner` block has the zygote's import time
# and RSS/USS), $OUT/preload-density.txt (the summary printed last), vmstat every 2 s.
# The job is mps_density.py's mps140 job (torch MNIST CNN, batch 32, 2 epochs of 6,400 images
# after a start barrier); mps_density.py (branch density) runs the same with
#   PACK_ARGS="--runner preload" ONLY="mps140" MPS_DENSITY_NEEDS="mps140=300" \
#     bash benchmarks/gpu/mps_density.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-$PWD/out}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
N=${N:-140}
LIMIT_S=${LIMIT_S:-200}
RUNNERS=${RUNNERS:-"preload process"}
# The trainers and the zygote need memgov (and its auto-enable .pth): an editable install.
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { echo "memgov install failed"; tail -20 "$OUT/install.log"; exit 1; }
vmstat -t 2 >"$OUT/vmstat.txt" 2>&1 &
VMSTAT=$!
trap 'kill $VMSTAT 2>/dev/null' EXIT
START=$(date +%s)
WORK=$(mktemp -d /tmp/mgpd-XXXX)  # short: the zygote's and MPS's socket paths
for runner in $RUNNERS; do
  left=$((500 - ($(date +%s) - START)))
  if [ "$left" -lt $((LIMIT_S + 30)) ]; then
    echo "skipped --runner $runner: ${left}s of the call left" | tee -a "$OUT/skipped.txt"
    continue
  fi
  out="$OUT/preload-density-$runner"
  echo "== memgov pack --n $N --runner $runner (timeout ${LIMIT_S}s)"
  TMPDIR=$WORK timeout --kill-after=20 $((LIMIT_S + 40)) "$PY" -m memgov pack --n "$N" \
    --runner "$runner" --mps on --no-solo --no-progress --timeout "$LIMIT_S" --out "$out" \
    experiments/mnist --epochs 2 -- --limit 6400 --eval-limit 64 \
    --barrier "$WORK/barrier-$runner" --barrier-n "$N" --barrier-timeout 120 \
    >"$out.stdout.txt" 2>"$out.stderr.txt"
  echo "pack rc=$? ($(($(date +%s) - START)) s into the call)"
  ps -eo pid,args | grep -E "memgov.pack._zygote|_launch.py" | grep -v grep \
    >"$out.strays.txt" || true
done
"$PY" - "$OUT" $RUNNERS <<'EOF' | tee "$OUT/preload-density.txt"
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
print("runner   ok/n  failed(reasons)  USS/job MiB med (max)  RSS/job med  footprint med  "
      "host USS peak GiB  zygote USS MiB  ready s med (max)  agg samples/s  wall s")
for runner in sys.argv[2:]:
    path = out / f"preload-density-{runner}" / "report.json"
    if not path.exists():
        print(f"{runner:8} no report"); continue
    r = json.loads(path.read_text()); run = r["runs"][-1]; jobs = run["jobs"]
    uss = [j["uss_mib"] for j in jobs if j.get("uss_mib")]
    rss = [j["rss_mib"] for j in jobs if j.get("rss_mib")]
    fp = [j["footprint_mib"] for j in jobs if j.get("footprint_mib")]
    # Launch to the trainer's start report (pack's ready_s, branch density), else to the first
    # epoch's start (that includes the barrier's wait for the last job).
    first = [j["ready_s"] for j in jobs if j.get("ready_s") is not None] or [
        j["epoch_spans"][0][0] - j["started_s"] for j in jobs
        if j.get("epoch_spans") and j.get("started_s") is not None]
    med = lambda xs: f"{statistics.median(xs):.0f}" if xs else "-"
    zy = (run.get("runner_details") or {}).get("zygote_uss_mib", "-")
    print(f"{runner:8} {run['ok']}/{run['n']}  {run['failed']} {run.get('reasons')}  "
          f"{med(uss)} ({max(uss, default=0):.0f})  {med(rss)}  {med(fp)}  "
          f"{(run.get('host_uss_peak_mib') or 0) / 1024:.1f}  {zy}  "
          f"{med(first)} ({max(first, default=0):.0f})  {run.get('aggregate_samples_per_s')}  "
          f"{run.get('wall_s')}")
    print("   runner_details:", json.dumps(run.get("runner_details")))
EOF
