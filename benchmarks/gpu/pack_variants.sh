#!/usr/bin/env bash
# Which trainer/MPS variant lets 25 packed torch jobs go furthest past one job?
#   bash benchmarks/gpu/pack_variants.sh "$OUT"
# 1. GPU operations and wall time per step of one job alone, per trainer variant (torch.profiler).
# 2. Per variant, one `memgov pack --n 25 --mode claim` with its own one-job (solo) run: the
#    aggregate samples/s while all 25 train, over the solo job's samples/s.
# Raw: $OUT/variants.json (profiles + every pack report); a table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-$PWD/out}}; mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/memgov-variants.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export MEMGOV_DIR=$WORK/ledger PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LIMIT=${VARIANT_LIMIT:-60000}

(cd experiments/mnist && timeout 150 "$PY" - >"$WORK/profile.json" 2>"$WORK/profile.err" <<'PYEOF'
import json, os, time
import numpy as np, torch
import harness, mnist_data
from torch.profiler import ProfilerActivity, profile
from train_torch import TorchTrainer
x, y, _, _ = mnist_data.load()
x, y = x[:3200], y[:3200]
out = {}
for name, flags in [("default", []), ("no-channels-last", ["--no-channels-last"]),
                    ("no-tf32", ["--no-tf32"]), ("neither", ["--no-channels-last", "--no-tf32"])]:
    torch.set_float32_matmul_precision("highest")  # the flags set it; start each from torch's
    trainer = TorchTrainer(harness.parse_args("torch", ["--device", "gpu", *flags]))
    rng = np.random.default_rng(0)
    for _ in range(2):
        trainer.train_epoch(mnist_data.batches(x, y, 32, rng, False))
    t0 = time.perf_counter()
    trainer.train_epoch(mnist_data.batches(x, y, 32, rng, False))
    wall = (time.perf_counter() - t0) / 100
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
        trainer.train_epoch(mnist_data.batches(x, y, 32, rng, False))
    ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    gpu_us = sum(e.device_time_total for e in ev) / 100
    out[name] = {"wall_ms_per_step": round(wall * 1e3, 4),
                 "gpu_ops_per_step": sum(e.count for e in ev) / 100,
                 "gpu_busy_us_per_step": round(gpu_us, 2),
                 "ops": sorted(([e.key[:90], e.count // 100, round(e.device_time_total / 100, 2)]
                                for e in ev), key=lambda r: -r[2])}
print(json.dumps(out))
PYEOF
) ; echo "profile rc=$?"; tail -3 "$WORK/profile.err"

variant() {  # variant NAME [ENV=VALUE...] -- TRAINER_FLAGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t0=$SECONDS
  env ${envs[@]+"${envs[@]}"} timeout --kill-after=10 120 "$PY" -m memgov pack --n 25 --framework torch \
    --mode claim --epochs 3 --timeout 100 --no-progress --out "$WORK/$name" experiments/mnist \
    -- --limit "$LIMIT" --eval-limit 500 "$@" >"$WORK/$name.out" 2>&1
  echo "=== $name rc=$? $((SECONDS - t0)) s"; tail -n 6 "$WORK/$name.out"
}
# Host CPU busy % every second, with timestamps, to line up with each run's job times.
vmstat -t -n 1 >"$OUT/variants_vmstat.txt" 2>&1 &
VMSTAT=$!
variant default --
variant mps-threads-25 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 --
variant neither -- --no-channels-last --no-tf32
variant mps-threads-10 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10 --
variant mps-threads-50 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 --
kill "$VMSTAT" 2>/dev/null

"$PY" - "$WORK" "$OUT/variants.json" <<'PYEOF'
import json, sys
from pathlib import Path
work, dest = Path(sys.argv[1]), Path(sys.argv[2])
try:
    profile = json.loads((work / "profile.json").read_text())
except Exception as e:
    profile = {"error": repr(e)}
packs = {}
for d in sorted(p for p in work.iterdir() if (p / "report.json").exists()):
    packs[d.name] = json.loads((d / "report.json").read_text())
dest.write_text(json.dumps({"profile": profile, "packs": packs}, indent=1))
print(f"{'variant':24} {'ops':>6} {'gpu us':>7} {'wall ms':>8}")
for k, v in profile.items() if isinstance(profile, dict) else []:
    if isinstance(v, dict) and "gpu_ops_per_step" in v:
        print(f"{k:24} {v['gpu_ops_per_step']:6.1f} {v['gpu_busy_us_per_step']:7.1f} {v['wall_ms_per_step']:8.3f}")
print(f"{'pack variant':24} {'ok':>5} {'agg/s':>9} {'span/s':>9} {'window':>7} {'solo/s':>8} {'x':>6}")
for k, r in packs.items():
    main = r
    print(f"{k:24} {main.get('ok')!s:>5} {main.get('aggregate_samples_per_s') or 0:9.0f} "
          f"{main.get('aggregate_samples_per_s_span') or 0:9.0f} {main.get('window_s') or 0:7.2f} "
          f"{main.get('solo_samples_per_s') or 0:8.0f} {main.get('speedup') or 0:6.2f}")
PYEOF
