#!/usr/bin/env bash
# Where a governed process's start-up CPU goes on the GPU machine, one process at a time (no
# neighbours, no MPS daemon: soft claims): `import torch` and one tensor on the GPU, hand-tuned
# (OMP_NUM_THREADS=1) against governed (MEMGOV_CLAIM, with OMP_NUM_THREADS=1 too so that both
# run one thread), ten alternated pairs with /usr/bin/time; each thread's CPU at exit in four
# settings; a cProfile of the main thread's CPU (time.thread_time) governed and hand-tuned.
# Run by `bash benchmarks/gpu/verify.sh startup_cpu` (which installs memgov and its bytecode).
cd "$(dirname "$0")/../.."
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export MEMGOV_DIR=$work/ledger PYTHONUNBUFFERED=1
cat > $work/prog.py <<'P'
import torch
torch.zeros(1, device="cuda")
P
cat > $work/prof.py <<'P'
import cProfile, pstats, time, sys, io
pr = cProfile.Profile(time.thread_time)
pr.enable()
import torch
torch.zeros(1, device="cuda")
pr.disable()
s = io.StringIO(); st = pstats.Stats(pr, stream=s); st.sort_stats("cumulative").print_stats(r"memgov|adapters|pynvml|mem_get_info|_lazy_init|cuda_init|zeros|<module>", 70)
print(s.getvalue())
P
python3 -c "import torch" 
for i in 1 2 3 4 5 6 7 8 9 10; do
  /usr/bin/time -f "plain %U %S %e" env OMP_NUM_THREADS=1 python3 $work/prog.py
  /usr/bin/time -f "memgov %U %S %e" env OMP_NUM_THREADS=1 MEMGOV_CLAIM=1600MiB python3 $work/prog.py 2>&1 | grep -v "^memgov:" >&2
done 2>&1 | grep -E "^(plain|memgov) " | sort | awk '{u[$1]+=$2; s[$1]+=$3; e[$1]+=$4; n[$1]++; print} END {for (k in u) print "MEAN", k, u[k]/n[k], s[k]/n[k], e[k]/n[k]}'
cat > $work/tasks.py <<'P'
import os, sys, time
import torch
torch.zeros(1, device="cuda")
tck = os.sysconf("SC_CLK_TCK")
rows = []
for t in sorted(os.listdir("/proc/self/task")):
    st = open(f"/proc/self/task/{t}/stat").read(); comm = st[st.index("(")+1:st.rindex(")")]
    f = st[st.rindex(")")+2:].split(); rows.append((comm, t, (int(f[11])+int(f[12]))/tck))
print("tasks", len(rows), "cpu by task:", [(c, round(x, 2)) for c, t, x in rows if x > 0])
P
for v in "OMP_NUM_THREADS=1" "MEMGOV_CLAIM=1600MiB" "OMP_NUM_THREADS=1 MEMGOV_CLAIM=1600MiB" "MEMGOV_THREADS=1 MEMGOV_CLAIM=1600MiB"; do
  echo "== tasks: $v"; env $v python3 $work/tasks.py 2>&1 | grep -v "^memgov:"
done
echo "== governed, cProfile on the main thread CPU"
OMP_NUM_THREADS=1 MEMGOV_CLAIM=1600MiB python3 $work/prof.py 2>&1 | head -90
echo "== plain, cProfile on the main thread CPU"
OMP_NUM_THREADS=1 python3 $work/prof.py 2>&1 | head -30
