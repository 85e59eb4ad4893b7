#!/usr/bin/env bash
# The container checks of docs/containers.md, with their raw output, on a host with an engine.
#
#   examples/docker/checks.sh OUT_DIR [USERNS_DOCKER_HOST]
#
# Needs: the memgov-mnist image (build.sh), memgov on PATH (a venv's bin), root. With a second
# engine started with --userns-remap=default (its DOCKER_HOST), the users check includes it and
# a pack runs on it. ONLY="n25 sim users killstop userns queue" picks checks.
set -uo pipefail
out=$(realpath -m "$1"); userns=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
only=${ONLY:-"n25 sim users killstop userns queue"}
py=$(dirname "$(command -v memgov)")/python
mkdir -p "$out"
cd "$root"
tiny=(-- --limit 64 --eval-limit 32)
want() { [[ " $only " == *" $1 "* ]]; }

# A pack in the background, `memgov status` and the ledger's files sampled from the host while it
# runs; the sample with the most claims is kept.
pack_watched() {  # NAME SIMSPEC PACK-ARGS...
  local name=$1 spec=$2; shift 2
  local dir=$out/$name; rm -rf "$dir"; mkdir -p "$dir"
  export MEMGOV_DIR=$dir/ledger
  echo "\$ MEMGOV_DIR=$MEMGOV_DIR ${DOCKER_HOST:+DOCKER_HOST=$DOCKER_HOST }${MEMGOV_DEVICES:+MEMGOV_DEVICES=$MEMGOV_DEVICES }memgov pack --out $dir/pack $*" > "$dir/pack.txt"
  local t0=$SECONDS
  ( memgov pack --out "$dir/pack" "$@" >> "$dir/pack.txt" 2>&1; echo "exit status: $?" >> "$dir/pack.txt" ) &
  local pid=$! best=-1 i=0
  while kill -0 $pid 2>/dev/null; do
    i=$((i + 1))
    MEMGOV_DEVICES=$spec memgov status --json > "$dir/s.json" 2>/dev/null || true
    local n; n=$("$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print(sum(len(x['claims']) for x in d['devices']))" "$dir/s.json" 2>/dev/null || echo 0)
    local q; q=$("$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print(sum(len(x['queue']) for x in d['devices']))" "$dir/s.json" 2>/dev/null || echo 0)
    echo "$(date -u +%T) claims=$n queued=$q containers=$(docker ps -q --filter name=^memgov-pack- | wc -l)" >> "$dir/claims-over-time.txt"
    if [ "$n" -gt "$best" ]; then
      best=$n
      { echo "sample $i at $(date -u +%T), $((SECONDS - t0)) s into the pack"
        echo "\$ docker ps --filter name=^memgov-pack- --format '{{.Names}} {{.Status}}'"
        docker ps --filter name=^memgov-pack- --format '{{.Names}} {{.Status}}'
        echo "\$ MEMGOV_DEVICES=$spec COLUMNS=140 memgov status"
        MEMGOV_DEVICES=$spec COLUMNS=140 memgov status
        echo "\$ ls -ln $MEMGOV_DIR/v1/sim0/claims"
        ls -ln "$MEMGOV_DIR/v1/sim0/claims"; } > "$dir/status-during.txt" 2>&1
      cp "$dir/s.json" "$dir/status-during.json"
    fi
    sleep 2
  done
  wait $pid
  { echo "after the pack:"; echo "\$ docker ps -a --filter name=^memgov-pack-"; docker ps -a --filter name=^memgov-pack-
    echo "\$ ls -la $MEMGOV_DIR/v1/sim0/claims"; ls -la "$MEMGOV_DIR/v1/sim0/claims"
    echo "\$ MEMGOV_DEVICES=$spec memgov status --json"; MEMGOV_DEVICES=$spec memgov status --json; } >> "$dir/pack.txt" 2>&1
  rm -f "$dir/s.json"
}

if want n25; then  # 25 containers at once (measured USS per container: 260-280 MiB)
  pack_watched n25 sim0:26GiB --runner docker --device cpu --n 25 --epochs 1 --no-progress \
    --host-per-job 400MiB experiments/mnist "${tiny[@]}"
fi
if want sim; then  # a simulated 8 GiB device: 8 claims of 1 GiB fit, the other 17 are refused
  MEMGOV_DEVICES=sim0:8GiB pack_watched sim8 sim0:8GiB --runner docker --device cpu --n 25 \
    --epochs 1 --no-solo --no-progress --host-per-job 400MiB experiments/mnist "${tiny[@]}"
fi
if want users; then
  { echo "\$ python tests/docker/users_check.py memgov-mnist /tmp/memgov-users-check $userns"
    COLUMNS=140 "$py" tests/docker/users_check.py memgov-mnist /tmp/memgov-users-check $userns
    echo "exit status: $?"; } > "$out/users.txt" 2>&1
  rm -rf /tmp/memgov-users-check
fi
if want killstop; then
  { echo "\$ python tests/docker/killstop_check.py $out/killstop"
    "$py" tests/docker/killstop_check.py "$out/killstop"; echo "exit status: $?"; } > "$out/killstop.txt" 2>&1
fi
if want userns && [ -n "$userns" ]; then  # pack's containers on the --userns-remap engine
  DOCKER_HOST=$userns pack_watched userns sim0:16GiB --runner docker --device cpu --n 3 \
    --epochs 8 --no-progress experiments/mnist -- --limit 640 --eval-limit 32
fi
if want queue; then  # the same small device with --wait and longer jobs: the rest queue
  MEMGOV_DEVICES=sim0:8GiB pack_watched queue sim0:8GiB --runner docker --device cpu --n 25 \
    --epochs 2 --no-solo --no-progress --host-per-job 400MiB --wait 900 experiments/mnist \
    -- --limit 320 --eval-limit 32
fi
