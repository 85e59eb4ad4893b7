#!/usr/bin/env bash
# Every GPU check of results/HISTORY.md, in one device call (< 9 minutes). Raw JSON goes to $OUT
# (or ./out when run by hand); a short table is printed last.
#   bash benchmarks/gpu/verify.sh [check ...]   checks: env torch mps pack (default), jax, gpu
# `jax` (benchmarks/gpu/jax_auto.py) is left out of the default: pack's check 3 runs the same JAX
# greedy-vs-MEMGOV_CLAIM comparison, and both do not fit in one 9-minute call. `gpu` runs the
# tests marked gpu (tests/gpu: MPS daemons stopped, signals) with pytest; its own call.
# Each of these is one call of its own (each takes most of the 9 minutes):
#   threads_torch, threads_jax  25 plain scripts vs hand-tuned, with and without MPS, staggered,
#                               and pack (benchmarks/gpu/threads_checks.py; docs/threads.md)
#   threads_1ab_torch, threads_1ab_jax, threads_stagger
#                               goals 1a+1b per framework, and goal 2 for both, longer runs
#   threads_pack                pack vs the hand-tuned scripts only, JAX then torch (torch twice,
#                               in turn: two rounds of each; one call)
#   threads_trainer             torch pack's trainer alone (kernels per step, flat vs torch's
#                               Adadelta), and started by hand beside pack and the scripts
#   density                     several MPS servers, 48/96/140 jobs, no-MPS context wall
#                               (benchmarks/gpu/mps_density.sh; docs/hard-limits.md)
#   fresh_pack                  memgov pack --n 140 and --n 25 with its defaults, each from an
#                               empty MEMGOV_DIR (benchmarks/gpu/fresh_pack.sh; docs/pack.md)
#   public_scripts, public_scripts_vae
#                               25 copies of unchanged public scripts (PyTorch examples' mnist
#                               and dcgan; vae in the second call; carried in .public/), memgov
#                               vs hand-tuned, a warm-up run then two rounds
#                               (benchmarks/gpu/scripts_checks.py); public_scripts_dcgan: DCGAN
#                               alone, three rounds (public_scripts_dcgan_diag: the
#                               allocator cap alone, MPS's memory limit alone;
#                               public_scripts_capped: MNIST and VAE against hand-tuned with the
#                               same memory cap; public_scripts_threads: the same with
#                               MEMGOV_THREADS=1 beside, whether the thread share costs;
#                               public_scripts_few: the same three with 1 and 4 MNIST copies,
#                               where memgov's share grows threads; FEW_N and FEW_CONDITIONS
#                               pick others; public_scripts_growth: 25 MNIST copies, the
#                               capped hand-tuned, memgov, memgov never growing its threads,
#                               MEMGOV_THREADS=1); public_scripts_mixed: 25 MNIST
#                               copies, the capped hand-tuned, memgov, and a run of both
#                               halves at once (every other job governed);
#                               public_scripts_suspects: 25 MNIST copies, hand-tuned, memgov,
#                               memgov without NVML's process lists, MEMGOV_THREADS=1;
#                               public_scripts_limits: the capped hand-tuned with and without
#                               MPS's memory limit, and memgov; public_scripts_env: the
#                               same with every variable a governed job ends up with
#                               (memgov off) in the middle; public_scripts_noruns: the
#                               same with memgov's run sampler left out; startup_cpu: one governed
#                               start-up's CPU against a hand-tuned one, and where it goes
#                               (benchmarks/gpu/startup_cpu.sh, about 2 minutes); startup_burst: 25 tiny torch programs
#                               started at once, hand-tuned vs governed, where start-up goes
#                               (benchmarks/gpu/startup_burst.py, about 2 minutes);
#                               mps_limit_cost: a small training loop with and without
#                               MPS's memory limit and governed, alone and ten at once;
#                               nvml_lists: NVML's process list beside 1 and 25 MPS clients
#                               (its CPU), and a client's own use read from its limit;
#                               public_scripts_sched: the capped hand-tuned with and
#                               without SCHED_BATCH, and memgov with it;
#                               public_scripts_timeline: 25 MNIST copies, the capped hand-tuned
#                               and memgov, two rounds, each run's start-up timeline;
#                               public_scripts_diag: MNIST
#                               under diagnostic conditions, CPU per thread; `pinned` the same for
#                               the plain loop with Adam and a pinned-memory gather; each run
#                               says where its time went (start-up, steady rate, after training,
#                               CPU seconds, torch's allocator retries at exit)
#   probes                      the JAX trainer's upload probe and the bare-context wall with and
#                               without CUDA_DEVICE_MAX_CONNECTIONS=1 (about 2 minutes)
#   queue_light, queue_random   the job queue (docs/queue.md) on a 30-job mix: sjf-exclusive (the
#                               baseline, one job at a time) then memgov's default, its goals
#                               checked (benchmarks/gpu/queue_checks.sh; light: small jobs,
#                               random: small and 10-26 GiB ones; needs .public/examples)
#   queue_policies              memgov, fifo, tetris, bestfit, fifo-exclusive (or QUEUE_POLICIES)
#                               on QUEUE_POLICIES_MIX (light); sjf-exclusive first unless
#                               QUEUE_SOLO names an earlier call's report (then every policy cold,
#                               or warm from QUEUE_PROFILES: queue_checks.sh says how); the goals:
#                               memgov within 3 % of the best of fifo, tetris, bestfit
#   exporter                    `memgov exporter` scraped 100 times beside pack --n 140, in pack's
#                               session and in its own (benchmarks/gpu/exporter_scrape.sh;
#                               docs/metrics.md; carry .whl with prometheus_client's wheel)
#   exporter_memory             the exporter's RSS, PSS, USS and per-mapping breakdown beside
#                               pack --n 140, and NVML's share step by step (about 5 minutes;
#                               benchmarks/gpu/exporter_memory.sh; docs/metrics.md; carry .whl)
#   auto                        claims that size themselves (docs/profiles.md): first runs, 30 jobs
#                               under MEMGOV_CLAIM=auto vs one hand-picked size, a first run beside
#                               24 neighbours (benchmarks/gpu/auto_checks.sh; needs AUTO_SCRIPTS)
#   fault_domain                one job's fatal CUDA fault (device-side assert; FAULT_KINDS=
#                               assert,illegal adds a wild store) beside 24 governed neighbours:
#                               same MPS daemon, another daemon, no MPS: what the neighbours see,
#                               how long until the daemon accepts clients (fault_domain.py)
#   auto_first_runs             a user's first day: 25 copies of each of the PyTorch examples'
#                               mnist and vae (.public/examples, unchanged, one epoch) at once
#                               under MEMGOV_CLAIM=auto from an empty MEMGOV_DIR, `memgov mps
#                               start`, then the same from their profiles, then one job whose own
#                               allocation fails (its OOM label); each job's claim and NVML peak
#                               (benchmarks/gpu/auto_first_runs.py; docs/profiles.md, "First runs")
#   queue_smoke                 the job queue's GPU paths: 12 torch jobs of 3 kinds, sjf-exclusive,
#                               memgov (--solo) and fifo (benchmarks/gpu/queue_smoke.sh; docs/queue.md)
#   floods                      no GPU: the ledger's churn beside another user's floods on this
#                               machine's 16 cores, alternated between FLOODS_CONDITIONS (default:
#                               this tree with its ledgers under /tmp and under /dev/shm, a tmpfs;
#                               NAME=CODE@FOLDER, CODE `tree` or an earlier tree's memgov/ and
#                               adapters/, carried) for FLOODS_BUDGET s (about 8 minutes;
#                               benchmarks/cpu/floods_ab.sh; docs/ledger.md, "Floods")
#   views                       what a governed process sees (docs/adapters.md): torch's and
#                               pynvml's figures against a 4 GiB budget, soft and hard, beside 24
#                               busy governed neighbours; a script sizing its batch from
#                               mem_get_info, views on and off; accelerate's infer_auto_device_map
#                               for a 5.2 GB model, ungoverned, views off, governed and run
#                               (benchmarks/gpu/views_checks.py, about 5 minutes; --dry on a CPU)
#   queue_ray                   the queue on Ray (one node: this host's GPUs): each torch job runs
#                               on the GPU its policy chose (benchmarks/gpu/queue_ray.py; needs Ray
#                               installed; meaningful on 2+ GPUs, e.g. nvidia-h200-x2)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MEMGOV_DIR=/tmp/memgov-verify
checks=${*:-env torch mps pack}
TOTAL_S=${VERIFY_BUDGET_S:-530}  # the device tool allows 600 s a call; this leaves the table room
summary=()

# VERIFY_DRY=1: list what each check would run (and whether its files exist), run nothing.
DRY=${VERIFY_DRY:-0}
[ "$DRY" = 1 ] || python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { echo "memgov install failed"; tail -20 "$OUT/install.log"; exit 1; }
# Bytecode, as a regular (non-editable) pip install writes it: the image sets
# PYTHONDONTWRITEBYTECODE=1, so an editable install would compile memgov's modules from source in
# every governed process (55 ms of CPU per claim on the CPU machine), never in a hand-tuned one.
[ "$DRY" = 1 ] || python3 -m compileall -q memgov adapters >>"$OUT/install.log" 2>&1
# The same for what a governed process imports and a hand-tuned one does not: the image's pynvml
# (one 200 KB module, 82 ms of CPU to compile in every governed process on the H200 machine,
# results/h200/2026-11-25-importtime-governed.txt.gz); `pip install nvidia-ml-py` writes its bytecode.
[ "$DRY" = 1 ] || python3 -m compileall -q "$(python3 -c 'import pynvml; print(pynvml.__file__)')" \
  >>"$OUT/install.log" 2>&1
# And for the frameworks the jobs import, in both conditions: the image's torch, torchvision,
# numpy and PIL carry no bytecode either, so every process compiled torch from source (3.5 s of
# a start-up's CPU, 25 at once on 16 cores; results/h200/2026-11-25-startup-burst-profile.txt),
# which no pip install leaves a user to do. Counted and timed in install.log.
# (Not for `floods` alone: it starts no framework.)
if [ "$DRY" != 1 ] && [ "$checks" != floods ]; then
  t0=$SECONDS
  for pkg in torch torchvision numpy PIL; do
    dir=$(python3 -c "import importlib.util as u; s = u.find_spec('$pkg'); print(s.submodule_search_locations[0] if s else '')" 2>/dev/null)
    [ -n "$dir" ] || continue
    before=$(find "$dir" -name '*.pyc' | wc -l)
    python3 -m compileall -q -j 0 "$dir" >>"$OUT/install.log" 2>&1
    echo "bytecode: $pkg $dir: $before .pyc before, $(find "$dir" -name '*.pyc' | wc -l) after" \
      | tee -a "$OUT/install.log"
  done
  echo "bytecode: compiled in $((SECONDS - t0)) s" | tee -a "$OUT/install.log"
fi

run() {  # run NAME TIMEOUT CMD...: time-boxed, output kept in $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  if [ "$DRY" = 1 ]; then
    local word missing=
    for word in "$@"; do
      case $word in benchmarks/*|tests/*) [ -e "$word" ] || missing="$missing $word" ;; esac
    done
    printf '%-22s %4ss  %s%s\n' "$name" "$limit" "$*" "${missing:+   MISSING:$missing}"
    return
  fi
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%-4s %4ss' "$name" "$rc" $((SECONDS - t0)))")
  echo "=== $name (rc=$rc, $((SECONDS - t0)) s)"; tail -n 25 "$OUT/$name.log"
}

for check in $checks; do
  case $check in
    env) run env 60 bash -c 'nvidia-smi; python3 -c "import torch, jax, filelock, typer, pynvml;
print(torch.__version__, jax.__version__, filelock.__version__, typer.__version__)";
which nvidia-cuda-mps-control; nproc; free -g; uname -r; stat -L -c "pidns inode %i" /proc/self/ns/pid;
python3 -m memgov devices' ;;
    torch) run torch_claim 150 python3 benchmarks/gpu/torch_claim.py --out "$OUT/torch_claim.json" ;;
    mps) [ -f benchmarks/gpu/mps_checks.py ] && run mps 270 python3 benchmarks/gpu/mps_checks.py --out "$OUT/mps_checks.json" ;;
    jax) [ -f benchmarks/gpu/jax_auto.py ] && run jax 200 python3 benchmarks/gpu/jax_auto.py "$OUT/jax_auto.json" ;;
    threads_torch) run threads_torch 560 python3 benchmarks/gpu/threads_checks.py torch \
      --budget 540 --out "$OUT" ;;
    threads_jax) run threads_jax 560 python3 benchmarks/gpu/threads_checks.py jax \
      --budget 540 --out "$OUT" ;;
    threads_pack)  # goal 3 of docs/threads.md: pack vs the hand-tuned scripts, JAX then torch
      run threads_pack_jax 215 python3 benchmarks/gpu/threads_checks.py jax \
        --only hand_mps,pack --budget 210 --tag pack --out "$OUT"
      run threads_pack_torch 290 python3 benchmarks/gpu/threads_checks.py torch \
        --only hand_mps,pack --repeat 2 --epochs 15 --budget 285 --tag pack --out "$OUT" ;;
    threads_1ab_torch)  # goals 1a and 1b of docs/threads.md for torch, longer runs (one call)
      run threads_1ab_torch 545 python3 benchmarks/gpu/threads_checks.py torch \
        --only memgov_mps,hand_mps,memgov,hand --epochs 15 --budget 540 --tag 1ab --out "$OUT" ;;
    threads_1ab_jax)  # the same for JAX (one call)
      run threads_1ab_jax 560 python3 benchmarks/gpu/threads_checks.py jax \
        --only memgov_mps,hand_mps,memgov,hand --epochs 6 --steps 1024 --job-timeout 120 \
        --budget 555 --tag 1ab --out "$OUT" ;;
    threads_stagger)  # goal 2: one arrival every 2 s, torch then JAX (one call)
      run threads_stagger_torch 250 python3 benchmarks/gpu/threads_checks.py torch \
        --only memgov_mps_stagger,hand_mps_stagger --epochs 15 --budget 245 --tag stagger \
        --out "$OUT"
      run threads_stagger_jax 280 python3 benchmarks/gpu/threads_checks.py jax \
        --only memgov_mps_stagger,hand_mps_stagger --budget 275 --tag stagger --out "$OUT" ;;
    threads_trainer)  # where torch pack's lead comes from: its trainer by hand, and its kernels
      run torch_step_profile 100 python3 benchmarks/gpu/torch_step_profile.py \
        --out "$OUT/torch_step_profile.json" --variant default= --variant torch-ops=--no-flat-optimizer
      run threads_trainer 430 python3 benchmarks/gpu/threads_checks.py torch \
        --only hand_mps,trainer_mps,pack --repeat 2 --epochs 15 --budget 420 --tag trainer \
        --out "$OUT" ;;
    density) run density 560 bash benchmarks/gpu/mps_density.sh "$OUT" ;;
    fresh_pack)  # pack --n 140 and --n 25 with its defaults, each from an empty MEMGOV_DIR
      run fresh_pack 560 bash benchmarks/gpu/fresh_pack.sh ;;
    public_scripts|public_scripts_vae)  # 25 copies of unchanged public scripts: memgov vs
      # hand-tuned, two rounds after a warm-up run; mnist and dcgan in one call, vae in another
      # (all three and the warm-up do not fit 9 minutes). A kind's round starts only when both its
      # runs fit the budget (the report is rewritten after every run, and on SIGTERM too)
      kinds=mnist,dcgan; [ "$check" = public_scripts_vae ] && kinds=vae
      run "$check" 575 python3 benchmarks/gpu/scripts_checks.py \
        --kinds "$kinds" --rounds 2 --budget 555 --tag "${kinds//,/-}" --out "$OUT" ;;
    public_scripts_dcgan)  # DCGAN alone, three rounds after a warm-up: the kind still below 1
      run public_scripts_dcgan 575 python3 benchmarks/gpu/scripts_checks.py \
        --kinds dcgan --rounds 3 --budget 555 --tag dcgan-rounds --out "$OUT" ;;
    public_scripts_dcgan_diag)  # DCGAN: the allocator cap alone, MPS's memory limit alone
      run public_scripts_dcgan_diag 575 python3 benchmarks/gpu/scripts_checks.py --kinds dcgan \
        --conditions hand_mps,memgov_mps,hand_mps_cap,hand_mps_limit --rounds 2 --budget 555 \
        --tag dcgan-diag --out "$OUT" ;;
    public_scripts_capped)  # MNIST and VAE: memgov against hand-tuned with the same memory cap
      # (torch's allocator capped at the claim, as an expert keeps jobs apart), two rounds each;
      # SCRIPTS_KINDS, SCRIPTS_ROUNDS and SCRIPTS_BUDGET (seconds) choose others
      # (e.g. SCRIPTS_KINDS=dcgan; a smaller budget beside another check in the call);
      # SCRIPTS_STARTUP_SAMPLES=MS: where each job's start-up CPU goes, by Python frame
      kinds=${SCRIPTS_KINDS:-mnist,vae}
      run public_scripts_capped 575 python3 benchmarks/gpu/scripts_checks.py --kinds "$kinds" \
        --conditions hand_mps_cap,memgov_mps --rounds "${SCRIPTS_ROUNDS:-2}" \
        --budget "${SCRIPTS_BUDGET:-555}" \
        ${SCRIPTS_STARTUP_SAMPLES:+--startup-samples "$SCRIPTS_STARTUP_SAMPLES"} \
        --tag "capped-${kinds//,/-}" --out "$OUT" ;;
    public_scripts_threads)  # MNIST and VAE: the capped hand-tuned, memgov, memgov with
      # MEMGOV_THREADS=1 (no follower: whether growing into idle cores costs these scripts)
      run public_scripts_threads 575 python3 benchmarks/gpu/scripts_checks.py --kinds mnist,vae \
        --conditions hand_mps_cap,memgov_mps,memgov_mps_fixed --rounds 2 --budget 555 \
        --tag threads --out "$OUT" ;;
    public_scripts_few)  # MNIST alone and 4 at once: the share grows threads there, hand-tuned
      # jobs keep 1 (the capped hand-tuned, memgov, memgov with MEMGOV_THREADS=1; two rounds each)
      for n in ${FEW_N:-1 4}; do
        run "public_scripts_few_$n" 280 python3 benchmarks/gpu/scripts_checks.py --kinds mnist \
          --n "$n" --conditions "${FEW_CONDITIONS:-hand_mps_cap,memgov_mps,memgov_mps_fixed}" --rounds 2 --no-warmup \
          --budget 260 --tag "few-$n" --out "$OUT"
      done ;;
    public_scripts_mixed)  # 25 MNIST copies: the capped hand-tuned, memgov, and both halves in
      # one run (every other job governed: what memgov costs each job, the machine's drift
      # shared); three rounds. SCRIPTS_KINDS, SCRIPTS_ROUNDS, SCRIPTS_BUDGET choose others, and
      # MIXED_CONDITIONS the conditions (e.g. mixed alone)
      kinds=${SCRIPTS_KINDS:-mnist}
      run public_scripts_mixed 575 python3 benchmarks/gpu/scripts_checks.py --kinds "$kinds" \
        --conditions "${MIXED_CONDITIONS:-hand_mps_cap,memgov_mps,mixed}" \
        --rounds "${SCRIPTS_ROUNDS:-3}" --budget "${SCRIPTS_BUDGET:-555}" \
        --tag "mixed${SCRIPTS_KINDS:+-${kinds//,/-}}" --out "$OUT" ;;
    public_scripts_suspects)  # 25 MNIST copies, all governed or none: the capped hand-tuned,
      # memgov, memgov without its NVML process lists, memgov with MEMGOV_THREADS=1 (no follower);
      # two rounds: what costs when every job is governed (the mixed runs found no cost per job)
      run public_scripts_suspects 575 python3 benchmarks/gpu/scripts_checks.py --kinds mnist \
        --conditions hand_mps_cap,memgov_mps,memgov_mps_nonvml,memgov_mps_fixed --rounds 2 \
        --budget 555 --tag suspects --out "$OUT" ;;
    public_scripts_limits)  # 25 MNIST copies: the capped hand-tuned, the same with MPS's
      # memory limit at the claim (memgov's two limits, set by hand), memgov; three rounds
      run public_scripts_limits 575 python3 benchmarks/gpu/scripts_checks.py --kinds mnist \
        --conditions hand_mps_cap,hand_mps_cap_limit,memgov_mps --rounds 3 --budget 555 \
        --tag limits --out "$OUT" ;;
    public_scripts_noruns)  # 25 MNIST copies: the capped hand-tuned, memgov without its run
      # sampler (no thread, live file or fold at exit), memgov; three rounds
      run public_scripts_noruns 575 python3 benchmarks/gpu/scripts_checks.py --kinds mnist \
        --conditions hand_mps_cap,memgov_mps_noruns,memgov_mps --rounds 3 --budget 555 \
        --tag noruns --out "$OUT" ;;
    public_scripts_env)  # 25 MNIST copies: the capped hand-tuned, the same with every variable
      # a governed job ends up with (memgov off), memgov; three rounds (SCRIPTS_KINDS,
      # SCRIPTS_ROUNDS and SCRIPTS_BUDGET choose others)
      kinds=${SCRIPTS_KINDS:-mnist}
      run public_scripts_env 575 python3 benchmarks/gpu/scripts_checks.py --kinds "$kinds" \
        --conditions hand_mps_cap,hand_mps_env,memgov_mps --rounds "${SCRIPTS_ROUNDS:-3}" \
        --budget "${SCRIPTS_BUDGET:-555}" --tag "env${SCRIPTS_KINDS:+-${kinds//,/-}}" \
        --out "$OUT" ;;
    public_scripts_sched)  # the capped hand-tuned with and without every thread SCHED_BATCH,
      # and memgov with it: whether fewer forced switches speed a host with more runnable
      # threads than cores (SCRIPTS_KINDS, SCRIPTS_ROUNDS, SCRIPTS_BUDGET choose others)
      kinds=${SCRIPTS_KINDS:-mnist,vae}
      uname -r; cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || true
      run public_scripts_sched 575 python3 benchmarks/gpu/scripts_checks.py --kinds "$kinds" \
        --conditions hand_mps_cap,hand_mps_cap_batch,memgov_mps_batch \
        --rounds "${SCRIPTS_ROUNDS:-2}" --budget "${SCRIPTS_BUDGET:-555}" \
        --tag "sched-${kinds//,/-}" --out "$OUT" ;;
    public_scripts_growth)  # 25 MNIST copies: whether the share's growth is what costs memgov
      run public_scripts_growth 575 python3 benchmarks/gpu/scripts_checks.py --kinds mnist \
        --conditions hand_mps_cap,memgov_mps,memgov_mps_nogrow,memgov_mps_fixed --rounds 2 \
        --budget 555 --tag growth --out "$OUT" ;;
    startup_cpu)  # one process at a time: a governed start-up's CPU against a hand-tuned one
      run startup_cpu 280 bash benchmarks/gpu/startup_cpu.sh ;;
    public_scripts_timeline)  # 25 MNIST copies, the capped hand-tuned and memgov, two rounds, no
      # warm-up: each run's start-up timeline (the probe's stamps) beside its span
      run public_scripts_timeline 345 python3 benchmarks/gpu/scripts_checks.py --kinds mnist \
        --conditions hand_mps_cap,memgov_mps --rounds 2 --no-warmup --budget 330 \
        --tag timeline --out "$OUT" ;;
    nvml_lists)  # NVML's process list beside 1 and 25 MPS clients, and a client's own use
      # under MPS's memory limit read without it (benchmarks/gpu/nvml_lists.py)
      run nvml_lists 150 python3 benchmarks/gpu/nvml_lists.py --out "$OUT" ;;
    mps_limit_cost)  # a small training loop with and without MPS's memory limit, and governed:
      # one process at a time and ten at once (benchmarks/gpu/mps_limit_cost.py)
      run mps_limit_cost 400 python3 benchmarks/gpu/mps_limit_cost.py --alone 3 --together 3 \
        --out "$OUT" ;;
    floods)  # the ledger's churn beside floods under FLOODS_CONDITIONS, alternated
      # shellcheck disable=SC2086  # FLOODS_CONDITIONS: several words
      run floods 560 bash -c 'df -T /tmp /dev/shm /run; bash benchmarks/cpu/floods_ab.sh "$@"' _ \
        "$OUT/floods" "${FLOODS_BUDGET:-500}" \
        ${FLOODS_CONDITIONS:-tmp=tree@/tmp tmpfs=tree@/dev/shm} ;;
    startup_burst)  # where memgov's start-up goes when 25 jobs start at once
      # BURST_BEFORE=DIR: a third condition, memgov from DIR (a copy of an earlier tree's
      # memgov/ and adapters/, first on PYTHONPATH), alternated with the other two
      run startup_burst 200 python3 benchmarks/gpu/startup_burst.py --steps \
        ${BURST_BEFORE:+--before "$BURST_BEFORE"} --out "$OUT" ;;
    public_scripts_diag)  # where memgov's time goes in the public MNIST: diagnostic conditions
      run public_scripts_diag 360 python3 benchmarks/gpu/scripts_checks.py --kinds mnist \
        --conditions hand_mps,memgov_mps,memgov_mps_omp1,hand_mps_limit,hand_mps_cap \
        --rounds 1 --no-warmup --budget 330 --tag diag-mnist --out "$OUT" ;;
    pinned)  # the Adam + pinned-gather loop, memgov vs hand-tuned, three rounds
      run pinned 300 python3 benchmarks/gpu/scripts_checks.py --kinds pinned --rounds 3 \
        --budget 290 --tag pinned --out "$OUT" ;;
    probes) run jax_probe 150 python3 benchmarks/gpu/jax_trainer_probe.py \
        --out "$OUT/jax_probe.json" --steps 3000
      run wall_default 170 python3 benchmarks/gpu/context_wall.py --out "$OUT/wall_default.json"
      run wall_one_connection 170 python3 benchmarks/gpu/context_wall.py \
        --out "$OUT/wall_one_connection.json" --env CUDA_DEVICE_MAX_CONNECTIONS=1 ;;
    auto) run auto 560 bash benchmarks/gpu/auto_checks.sh "$OUT" ;;
    fault_domain)  # one job's fatal CUDA fault beside 24 governed neighbours: on their MPS
      # daemon, on another, without MPS; FAULT_KINDS=assert,illegal (benchmarks/gpu/fault_domain.py)
      run fault_domain 540 python3 benchmarks/gpu/fault_domain.py --fault "${FAULT_KINDS:-assert}" \
        --out "$OUT" ;;
    auto_first_runs) run auto_first_runs 470 python3 benchmarks/gpu/auto_first_runs.py \
      --examples "${AUTO_EXAMPLES:-.public/examples}" --out "$OUT" ;;
    queue_smoke) run queue_smoke 500 bash benchmarks/gpu/queue_smoke.sh "$OUT" ;;
    views) run views 480 python3 benchmarks/gpu/views_checks.py --out "$OUT" ;;
    queue_ray) run queue_ray 300 python3 benchmarks/gpu/queue_ray.py "$OUT" 6 ;;
    queue_light|queue_random|queue_policies)  # what is left of TOTAL_S, in one device call
      left=$((TOTAL_S - SECONDS)); mix=${check#queue_}; policies=(sjf-exclusive memgov)
      [ "$check" = queue_policies ] && mix=${QUEUE_POLICIES_MIX:-light} \
        && policies=(${QUEUE_POLICIES:-memgov fifo tetris bestfit fifo-exclusive})
      run "$check" $((left + 20)) env OUT="$OUT" QUEUE_BUDGET_S="${QUEUE_BUDGET_S:-$left}" \
        bash benchmarks/gpu/queue_checks.sh "$mix" "${policies[@]}" ;;
    exporter) run exporter 560 bash benchmarks/gpu/exporter_scrape.sh ;;
    exporter_memory) run exporter_memory 480 bash benchmarks/gpu/exporter_memory.sh ;;
    gpu) run gpu_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu \
      --junitxml="$OUT/gpu_tests.xml" ;;
    # pack gets what is left of TOTAL_S (its last check, the dense one, is cut first).
    pack) left=$((TOTAL_S - SECONDS)); export PACK_BUDGET_S=$((left - 30))
      [ -f benchmarks/gpu/pack_checks.sh ] && run pack "$left" bash benchmarks/gpu/pack_checks.sh "$OUT" ;;
  esac
done
[ "$DRY" = 1 ] && exit 0
echo; echo "== summary"; printf '%s\n' "${summary[@]}"
python3 benchmarks/gpu/summarize.py "$OUT"
