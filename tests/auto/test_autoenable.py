"""Auto-enable end to end: real interpreters, the installed .pth, real frameworks (jax, torch)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from memgov import _autoenable

GIB = 2**30

# Printed by a governed program: what it holds and what the ledger shows (from inside).
REPORT = """
import json, memgov
from memgov import _autoenable, _status
held = memgov.current()
claims = [c for d in _status.status()["devices"] for c in d["claims"]]
print(json.dumps({"bytes": None if held is None else held.bytes,
                  "mode": _autoenable.outcome.get("mode"), "claims": len(claims)}))
"""


def report(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def memgov_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("memgov:")]


def test_unset_loads_nothing(env, py):
    ours = "('memgov', 'memgov_torch', 'memgov_jax', 'memgov_tensorflow')"
    code = f"import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {ours}))"
    result = py(code, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert result.stderr == ""


def test_set_but_no_framework_imported_claims_nothing(env, py):
    """pip and every other Python program stay untouched: no claim, no output."""
    env["MEMGOV_CLAIM"] = "2GiB"
    code = "from memgov import _status; print(_status.status()['devices'][0]['claims'])"
    result = py(code, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert memgov_lines(result.stderr) == []


def test_claim_taken_at_framework_import(env, py):
    env.update(MEMGOV_CLAIM="2GiB", MEMGOV_THREADS="1")
    code = (
        "import jax\nimport jax.numpy as jnp\nassert float(jnp.ones(3).sum()) == 3.0\n"
        "import torch\nassert torch.get_num_threads() == 1\n"
        "assert torch.get_num_interop_threads() == 1\n" + REPORT
    )
    result = py(code, env)
    assert report(result) == {"bytes": 2 * GIB, "mode": "claim", "claims": 1}
    lines = memgov_lines(result.stderr)
    assert any("2.00 GiB on sim0" in line and "MEMGOV_CLAIM=2GiB" in line for line in lines)
    assert any(line.startswith("memgov: jax: preallocation off") for line in lines)
    assert any(line.startswith("memgov: torch: 1 CPU thread(s)") for line in lines)


def test_a_governed_import_torch_loads_no_psutil(env, py):
    """The claim at ``import torch`` keeps its start-up cost down: the torch adapter counts the
    physical cores from sysfs (memgov_torch._physical_cores), not by importing psutil."""
    env["MEMGOV_CLAIM"] = "1GiB"
    result = py("import sys, torch\nprint('psutil' in sys.modules)\n" + REPORT, env)
    assert report(result) == {"bytes": GIB, "mode": "claim", "claims": 1}
    assert result.stdout.splitlines()[0] == "False"


def test_growth_claims_nothing(env, py):
    env["MEMGOV_CLAIM"] = "growth"
    result = py("import jax\n" + REPORT, env)
    assert report(result) == {"bytes": None, "mode": "growth", "claims": 0}


def test_off_and_quiet(env, py):
    env.update(MEMGOV_CLAIM="off", CUDA_DEVICE_MEMORY_LIMIT="4g")
    result = py("import jax\n" + REPORT, env)
    assert report(result) == {"bytes": None, "mode": "off", "claims": 0}
    env.update(MEMGOV_CLAIM="1GiB", MEMGOV_QUIET="1")
    del env["CUDA_DEVICE_MEMORY_LIMIT"]
    result = py("import jax\n" + REPORT, env)
    assert report(result)["bytes"] == GIB
    assert memgov_lines(result.stderr) == []


def test_scheduler_budget_without_memgov_claim(env, py):
    """HAMi's enforced 4g becomes a budget a margin below it, with no memgov setting at all."""
    env["CUDA_DEVICE_MEMORY_LIMIT"] = "4g"
    result = py("import jax\n" + REPORT, env)
    margin = int(4 * GIB * 0.05)
    assert report(result) == {"bytes": 4 * GIB - margin, "mode": "claim", "claims": 1}
    assert any("HAMi CUDA_DEVICE_MEMORY_LIMIT='4g'" in line for line in memgov_lines(result.stderr))


def test_auto_without_scheduler_budget_is_a_first_run_then_the_profile(env, py):
    # No scheduler budget: a first run (half of the free budget, at most a quarter of the
    # 16 GiB device), then the job's measured peak sizes it (docs/profiles.md).
    env["MEMGOV_CLAIM"] = "auto"
    result = py("import jax\n" + REPORT, env)
    assert report(result) == {"bytes": 4 * GIB, "mode": "claim", "claims": 1}
    assert any(
        line.startswith("memgov: auto: 4.00 GiB = first run of python-c")
        for line in memgov_lines(result.stderr)
    )
    again = py("import jax\n" + REPORT, env)
    assert report(again)["bytes"] < 4 * GIB
    assert any("run of python-c + 10 % + 64 MiB" in line for line in memgov_lines(again.stderr))


def test_unset_claim_without_scheduler_budget_is_growth(env, py):
    env["CUDA_DEVICE_MEMORY_LIMIT"] = ""  # wakes auto-enable; blank is unset: no budget
    result = py("import jax\n" + REPORT, env)
    assert report(result) == {"bytes": None, "mode": "growth", "claims": 0}


def test_explicit_claim_first_wins(env, py):
    env["MEMGOV_CLAIM"] = "2GiB"
    code = "import memgov\nmine = memgov.claim('3GiB')\nimport jax\n" + REPORT
    assert report(py(code, env)) == {"bytes": 3 * GIB, "mode": "explicit", "claims": 1}


def test_budget_that_does_not_fit_warns_and_runs(env, py):
    env["MEMGOV_CLAIM"] = "12GiB"
    env["MEMGOV_DEVICES"] = "sim0:16GiB:8GiB"  # 8 GiB used outside memgov
    result = py("import jax\nprint('survived')", env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "survived"
    warnings = [line for line in memgov_lines(result.stderr) if "warning" in line]
    assert len(warnings) == 1 and "cannot claim 12.00 GiB" in warnings[0]


# -- child processes -----------------------------------------------------------------------------

CHILD_REPORT = REPORT.replace("print(", "print('CHILD', ")


def test_subprocess_child_does_not_claim_again(env, py):
    env["MEMGOV_CLAIM"] = "2GiB"
    code = f"""
import subprocess, sys
import jax
child = subprocess.run([sys.executable, "-c", "import jax\\n" + {REPORT!r}],
                       capture_output=True, text=True)
assert child.returncode == 0, child.stderr
print(child.stdout.strip().splitlines()[-1])
"""
    result = py(code, env)
    child = report(result)
    assert child == {"bytes": None, "mode": "child", "claims": 1}


def test_multiprocessing_spawn_child_does_not_claim_again(env, py):
    env["MEMGOV_CLAIM"] = "2GiB"
    code = f"""
import multiprocessing as mp

def work(queue):
    import io, contextlib
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        import jax
        exec({REPORT!r}, {{}})
    queue.put(out.getvalue())

if __name__ == "__main__":
    import jax
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=work, args=(queue,))
    proc.start()
    print(queue.get(timeout=120).strip())
    proc.join()
"""
    script = env["MEMGOV_DIR"] + "-spawn.py"
    with open(script, "w") as handle:
        handle.write(code)
    result = subprocess.run(
        [sys.executable, script], env=env, capture_output=True, text=True, timeout=180
    )
    assert report(result) == {"bytes": None, "mode": "child", "claims": 1}


def test_torch_dataloader_fork_workers_do_not_claim(env, py):
    env["MEMGOV_CLAIM"] = "2GiB"
    code = """
import json
import torch
from torch.utils.data import DataLoader, Dataset
import memgov
from memgov import _status

class Probe(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        claims = [c for d in _status.status()["devices"] for c in d["claims"]]
        return torch.tensor([len(claims), memgov.current() is None])

seen = torch.cat(list(DataLoader(Probe(), num_workers=2, batch_size=1))).tolist()
print(json.dumps(seen))
"""
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [[1, 1], [1, 1]]


def test_dead_parent_record_does_not_block_a_claim(env, py):
    env.update(MEMGOV_CLAIM="1GiB", MEMGOV_HOLDER="sim0/00000000000000000001-dead.json")
    assert report(py("import jax\n" + REPORT, env)) == {"bytes": GIB, "mode": "claim", "claims": 1}


# -- memgov run and the import-memgov promise ----------------------------------------------------


def test_memgov_run(env):
    memgov = [sys.executable, "-m", "memgov.cli"]
    code = "import jax\n" + REPORT
    result = subprocess.run(
        [*memgov, "run", "--claim", "1GiB", "--threads", "1", "--", sys.executable, "-c", code],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert report(result) == {"bytes": GIB, "mode": "claim", "claims": 1}
    bad = subprocess.run(
        [*memgov, "run", "--claim", "lots", "--", sys.executable, "-c", "pass"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "--claim 'lots': accepted a size" in bad.stderr


def test_import_memgov_stops_greedy_preallocation(env, py):
    code = (
        "import os, memgov; print(os.environ['TF_FORCE_GPU_ALLOW_GROWTH'], "
        "os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"
    )
    assert py(code, env).stdout.split() == ["true", "false"]
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"  # an explicit user setting wins
    assert py(code, env).stdout.split() == ["true", "true"]


def test_a_slow_admission_says_where_its_time_went(env: dict[str, str]) -> None:
    # A holder of the whole simulated GPU releases 0.7 s after the auto-enabled process has
    # queued for it (MEMGOV_WAIT); that process then prints its admission line, which quick
    # claims do not.
    queue = Path(env["MEMGOV_DIR"]) / "v1" / "sim0" / "queue"
    code = (
        "import memgov, pathlib, time; c = memgov.claim('16GiB'); print('held', flush=True)\n"
        f"q = pathlib.Path({str(queue)!r})\n"
        "while not any(q.glob('*.json')): time.sleep(0.02)\n"
        "time.sleep(0.7); c.release()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**env, "MEMGOV_RESERVE": "0"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        waited = subprocess.run(
            [sys.executable, "-c", "import torch"],
            capture_output=True,
            text=True,
            timeout=180,
            env={**env, "MEMGOV_RESERVE": "0", "MEMGOV_CLAIM": "8GiB", "MEMGOV_WAIT": "60"},
        )
        assert waited.returncode == 0, waited.stderr
        assert time.monotonic() - started >= 0.7
        lines = [x for x in waited.stderr.splitlines() if x.startswith("memgov: admission: ")]
        assert len(lines) == 1 and "look(s) under the admission lock" in lines[0], waited.stderr
    finally:
        holder.wait(timeout=60)
    quick = subprocess.run(
        [sys.executable, "-c", "import torch"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**env, "MEMGOV_CLAIM": "1GiB"},
    )
    assert quick.returncode == 0 and "memgov: claim" in quick.stderr, quick.stderr
    # Said only of an admission that took SLOW_ADMISSION_S or more (a starved host's can).
    said = re.findall(r"memgov: admission: ([0-9.]+) s;", quick.stderr)
    assert all(float(s) >= _autoenable.SLOW_ADMISSION_S for s in said), quick.stderr


GC_SEEN = """
import gc
from memgov import _autoenable
seen = []


def watch(name):
    inner = getattr(_autoenable, name)

    def watched(*args):
        seen.append(gc.isenabled())
        return inner(*args)

    setattr(_autoenable, name, watched)


watch("_decide_threads")  # as the import begins
watch("_govern")  # when it has ended
{before}
import torch
print(seen, gc.isenabled())
"""


def test_the_collector_pauses_while_memgov_governs_and_resumes_after(env, py):
    """memgov's ~5,600 new objects at the hook otherwise bring one more full collection of
    torch's heap into `import torch` than the same import ungoverned has (3 against 2;
    results/cpu-2core/2026-11-28-governed-import-gc.txt): the collector is off while the hook
    governs, on again after."""
    env["MEMGOV_CLAIM"] = "1GiB"
    result = py(GC_SEEN.format(before=""), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[False,", "False]", "True"]


def test_a_collector_the_program_turned_off_stays_off(env, py):
    env["MEMGOV_CLAIM"] = "1GiB"
    result = py(GC_SEEN.format(before="gc.disable()"), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[False,", "False]", "False"]


def test_the_collector_resumes_after_a_claim_that_fails(env, py):
    """A claim that does not fit: the program runs on without a budget, its collector on."""
    env["MEMGOV_CLAIM"] = "999GiB"
    result = py(GC_SEEN.format(before=""), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[False,", "False]", "True"]


# What the collector holds after a governed `import torch`, and whether it still frees a cycle
# made after the import (frozen objects are never collected; new ones must be).
FROZEN = """
import gc, json, weakref
import torch
import memgov._autoenable as auto


class Node:
    pass


a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"frozen": gc.get_freeze_count(), "said": auto.outcome.get("gc_frozen", 0),
                  "cycle_freed": gone() is None, "mode": auto.outcome.get("mode")}))
"""


def test_a_governed_framework_import_freezes_the_objects_it_left(env, py):
    """``import torch``'s objects move to the permanent generation: later full collections skip
    them (results/cpu-2core/2026-11-29-gc-freeze.txt); what the program makes after is collected
    as before."""
    env["MEMGOV_CLAIM"] = "1GiB"
    seen = report(py(FROZEN, env))
    assert seen["mode"] == "claim"
    assert seen["frozen"] > 50_000  # torch leaves ~170,000 tracked objects
    assert seen["said"] >= seen["frozen"] - 1000
    assert seen["cycle_freed"] is True


def test_the_freeze_follows_its_setting_and_who_governs(env, py):
    """Off with MEMGOV_GC_FREEZE=off, with MEMGOV_CLAIM=off, and where the program claimed itself
    before the import (the program decides); on in a governed parent's child too."""
    env["MEMGOV_CLAIM"] = "1GiB"
    frozen = {}
    for name, extra, before in (
        ("setting off", {"MEMGOV_GC_FREEZE": "off"}, ""),
        ("claim off", {"MEMGOV_CLAIM": "off"}, ""),
        ("explicit", {}, "import memgov\nmine = memgov.claim('1GiB')\n"),
        ("growth", {"MEMGOV_CLAIM": "growth"}, ""),
    ):
        seen = report(py(before + FROZEN, {**env, **extra}))
        frozen[name] = (seen["mode"], seen["frozen"] > 50_000, seen["cycle_freed"])
    assert frozen == {
        "setting off": ("claim", False, True),
        "claim off": ("off", False, True),
        "explicit": ("explicit", False, True),
        "growth": ("growth", True, True),
    }


def test_garbage_in_the_freeze_setting_is_refused_like_any_other(env, py):
    """As for every setting: one warning naming it and what it accepts, the program runs on
    (ungoverned, collector untouched)."""
    env.update(MEMGOV_CLAIM="1GiB", MEMGOV_GC_FREEZE="maybe")
    result = py(FROZEN, env)
    assert report(result) == {"frozen": 0, "said": 0, "cycle_freed": True, "mode": None}
    assert memgov_lines(result.stderr) == [
        "memgov: warning: MEMGOV_GC_FREEZE='maybe': accepted 1/true/yes/on or 0/false/no/off; "
        "continuing without a memgov budget (MEMGOV_STRICT=1 or memgov run --strict makes this "
        "an error)"
    ]


# Records the thread variable when numpy's code begins: `import torch` imports numpy, whose
# OpenBLAS starts its thread pool, sized from these variables, as it loads.
THREADS_AT_NUMPY = """
import os, sys
seen = []


class Watch:  # ahead of the finders: notes the variable, finds nothing itself
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not seen:
            seen.append(os.environ.get("OMP_NUM_THREADS"))
            seen.append(os.environ.get("OPENBLAS_NUM_THREADS"))
        return None


sys.meta_path.insert(0, Watch())
import torch
print(seen, torch.get_num_threads())
"""


def test_the_thread_variables_are_set_before_the_frameworks_libraries_load(env, py):
    """The share is decided as `import torch` begins, so the libraries its import loads start
    their thread pools at the share: numpy's OpenBLAS starts one thread per core at load
    otherwise, each spinning for a while (15 threads in 25 jobs starting at once on 16 cores
    cost every governed job 0.8 s of CPU more than a hand-tuned one: docs/threads.md)."""
    env.update(MEMGOV_CLAIM="1GiB", MEMGOV_THREADS="1")
    result = py(THREADS_AT_NUMPY, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("]")[0] + "]" == "['1', '1']"
    assert result.stdout.split()[-1] == "1"


def holder_is(claim: str) -> str:
    """Program lines: print whether the CPU-share records name exactly the claim ``claim``."""
    return (
        "from memgov._cpu import share as _cpushare\n"
        "holders = [p.holder for p in _cpushare.peers(clean=False)]\n"
        f"print(holders == [f'{{{claim}.device}}/{{{claim}.record}}'])\n"
    )


def test_a_framework_whose_import_began_before_the_share_is_not_one_imported_before_it(env, py):
    """The share is decided as `import torch` begins: torch, mid-import then, is not one the
    user imported (and set threads in) before it, so the torch adapter applies the share; the
    claim at the import's end reuses that decision and names itself in its record."""
    env.update(MEMGOV_CLAIM="1GiB", MEMGOV_THREADS="1")
    code = (
        "import torch, memgov\nfrom memgov._cpu import threads as _threads\n"
        "held = memgov.current()\n"
        "print(_threads.preloaded(), torch.get_num_threads())\n" + holder_is("held")
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[]", "1", "True"]
    assert "FAILED" not in result.stderr


def fake_jax(tmp_path: Path, body: str) -> str:
    """A folder with a jax whose import runs ``body``, for PYTHONPATH."""
    folder = tmp_path / "fake"
    (folder / "jax").mkdir(parents=True)
    (folder / "jax" / "__init__.py").write_text(body)
    return str(folder)


def broken_jax(tmp_path: Path) -> str:
    """A folder with a jax that fails to import (a broken install), for PYTHONPATH."""
    return fake_jax(tmp_path, "raise ImportError('this jax is broken')\n")


# An optional framework probed the way programs do, then what the program does next.
PROBE_THEN_TORCH = """
import memgov
try:
    import jax
except ImportError as exc:
    print("probe:", exc, memgov.current())
{then}
"""


def test_a_framework_import_that_fails_claims_nothing_and_the_next_one_claims(
    env, py, tmp_path: Path
):
    """Only the share is decided before the framework's code runs; the claim waits for the
    import to succeed, so an optional framework probed with `try: import jax` holds no budget
    when it fails, and the framework the program does use claims."""
    env.update(MEMGOV_CLAIM="1GiB", PYTHONPATH=broken_jax(tmp_path))
    then = "import torch\nprint('then:', memgov.current().bytes)"
    result = py(PROBE_THEN_TORCH.format(then=then), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["probe: this jax is broken None", f"then: {GIB}"]
    lines = memgov_lines(result.stderr)
    assert sum("[MEMGOV_CLAIM=1GiB; at import torch]" in line for line in lines) == 1, lines


def test_a_failing_optional_import_under_strict_raises_only_its_own_error(env, py, tmp_path: Path):
    """MEMGOV_STRICT=1 and a claim that cannot fit: the probe of a broken jax still meets only
    its ImportError (no claim was tried), and the program goes on."""
    env.update(MEMGOV_CLAIM="32GiB", MEMGOV_STRICT="1", PYTHONPATH=broken_jax(tmp_path))
    result = py(PROBE_THEN_TORCH.format(then="print('went on')"), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["probe: this jax is broken None", "went on"]


# Collections while `import torch` runs, and the collector after it.
COLLECTIONS_IN_IMPORT = """
import gc, json
counted = [0, 0]


def count(phase, info):
    if phase == "stop":
        counted[0] += 1
        counted[1] += info["generation"] == 2


gc.callbacks.append(count)
import torch
during, full = counted
gc.unfreeze()
garbage = gc.collect()  # what the freeze would have kept for good
print(json.dumps({"during": during, "full": full, "on": gc.isenabled(), "garbage": garbage}))
"""


def test_a_governed_framework_import_runs_one_collection_and_freezes_no_garbage(env, py):
    """The collector is paused from the import's start to its end, where it collects once (the
    import's own garbage, ~7,000 objects, is freed, not frozen) and freezes what is alive: an
    ungoverned `import torch` runs hundreds of collections, two of them full."""
    env["MEMGOV_CLAIM"] = "1GiB"
    governed = report(py(COLLECTIONS_IN_IMPORT, env))
    left_alone = report(py(COLLECTIONS_IN_IMPORT, {**env, "MEMGOV_GC_FREEZE": "off"}))
    assert (governed["during"], governed["full"], governed["on"]) == (1, 1, True)
    assert governed["garbage"] < 200, governed
    assert left_alone["during"] > 50 and left_alone["full"] >= 2 and left_alone["on"] is True


def test_a_framework_import_that_fails_ends_the_pause_and_freezes_nothing(env, py, tmp_path: Path):
    """A broken jax probed first: the collector is on again after its ImportError, nothing is
    frozen; the torch import after it is paused and frozen as usual."""
    env.update(MEMGOV_CLAIM="1GiB", PYTHONPATH=broken_jax(tmp_path))
    then = (
        "import gc\nprint('after jax:', gc.isenabled(), gc.get_freeze_count())\n"
        "import torch\nprint('after torch:', gc.isenabled(), gc.get_freeze_count() > 50_000)"
    )
    result = py(PROBE_THEN_TORCH.format(then=then), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "probe: this jax is broken None",
        "after jax: True 0",
        "after torch: True True",
    ]


def test_a_child_forked_by_another_thread_mid_import_has_its_collector_on(env, py, tmp_path: Path):
    """A thread forks while the main thread imports a framework (the collector paused for that
    import): in the child that import never ends, so memgov's at-fork hook turns the collector
    back on; the parent's import ends, frozen, with its collector on."""
    slow = (
        "import os, time\nopen(os.environ['STARTED'], 'w').close()\n"
        "while not os.path.exists(os.environ['FORKED']):\n    time.sleep(0.01)\n"
    )
    env.update(
        MEMGOV_CLAIM="1GiB",
        PYTHONPATH=fake_jax(tmp_path, slow),
        STARTED=str(tmp_path / "started"),
        FORKED=str(tmp_path / "forked"),
    )
    code = """
import gc, os, threading, time

def fork_when_started():
    while not os.path.exists(os.environ["STARTED"]):
        time.sleep(0.01)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, b"child %s" % str(gc.isenabled()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(os.read(read, 100).decode())
    open(os.environ["FORKED"], "w").close()

forker = threading.Thread(target=fork_when_started)
forker.start()
import jax
forker.join()
print("parent", gc.isenabled(), gc.get_freeze_count() > 0)
"""
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["child True", "parent True True"]


def test_the_programs_garbage_from_before_the_import_is_freed_not_frozen(env, py):
    """The collection at the import's end frees the cycles the program had already dropped
    (frozen, they would never be)."""
    env["MEMGOV_CLAIM"] = "1GiB"
    code = (
        "import gc, weakref\nclass Node: pass\na, b = Node(), Node()\na.o, b.o = b, a\n"
        "gone = weakref.ref(a)\ndel a, b\nimport torch\n"
        "print(gone() is None, gc.get_freeze_count() > 50_000)"
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True"]


# A framework import that raises, then the collector's state.
IMPORT_RAISES = """
import gc
from memgov._base.errors import MemgovError
try:
    import {module}
except {error}:
    print("raised")
print(gc.isenabled(), gc.get_freeze_count())
"""


def test_a_strict_refusal_fails_the_import_and_freezes_nothing(env, py):
    env.update(MEMGOV_CLAIM="99GiB", MEMGOV_STRICT="1")
    result = py(IMPORT_RAISES.format(module="torch", error="MemgovError"), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["raised", "True 0"]


def test_an_interrupted_framework_import_leaves_the_collector_on(env, py, tmp_path: Path):
    """Ctrl-C (KeyboardInterrupt, not an Exception) while the framework's code runs."""
    env.update(MEMGOV_CLAIM="1GiB", PYTHONPATH=fake_jax(tmp_path, "raise KeyboardInterrupt\n"))
    result = py(IMPORT_RAISES.format(module="jax", error="KeyboardInterrupt"), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["raised", "True 0"]


def test_a_fork_by_the_importing_thread_itself_gives_the_child_its_collector_back(
    env, py, tmp_path: Path
):
    """The framework's own code forks: the child has its collector back at the fork, nothing
    frozen there (whether it goes back through the import's end is the child's code's choice);
    the parent's pause ends and freezes at the import's end."""
    env.update(
        MEMGOV_CLAIM="1GiB",
        PYTHONPATH=fake_jax(tmp_path, "import os\nCHILD = os.fork() == 0\n"),
    )
    code = """
import gc, os
import jax
line = "%s %s %s" % ("child" if jax.CHILD else "parent", gc.isenabled(), gc.get_freeze_count() > 0)
if jax.CHILD:
    print(line, flush=True)
    os._exit(0)
os.wait()
print(line)
"""
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["child True False", "parent True True"]


def test_a_multiprocessing_child_started_mid_import_has_its_collector_on(env, py, tmp_path: Path):
    """A fork-context Process started by the framework's own code while it imports: the child
    runs its target and exits, never back through the import's end."""
    env.update(
        MEMGOV_CLAIM="1GiB",
        PYTHONPATH=fake_jax(
            tmp_path,
            "import gc, multiprocessing as mp\n"
            "def report(queue):\n    queue.put(gc.isenabled())\n"
            "ctx = mp.get_context('fork')\nqueue = ctx.Queue()\n"
            "worker = ctx.Process(target=report, args=(queue,))\nworker.start()\n"
            "CHILD_SAW = queue.get(timeout=60)\nworker.join()\n",
        ),
    )
    result = py("import gc, jax\nprint(jax.CHILD_SAW, gc.isenabled())", env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True"]


def test_no_child_forked_around_the_import_has_its_collector_off(env, py):
    """A thread forks whenever it sees the collector off with no pause recorded (the moments
    around the pause's start and end): each child has its collector on."""
    env["MEMGOV_CLAIM"] = "1GiB"
    code = """
import gc, os, threading
from memgov import _collector
done, seen = [], []


def watch():
    while not done and len(seen) < 20:
        if not gc.isenabled() and not _collector._pauses:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(write, b"1" if gc.isenabled() else b"0")
                os._exit(0)
            os.waitpid(pid, 0)
            seen.append(os.read(read, 1).decode())
            os.close(read)
            os.close(write)


thread = threading.Thread(target=watch)
thread.start()
import torch
done.append(True)
thread.join()
print("children with the collector off:", seen.count("0"), gc.isenabled())
"""
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["0", "True"]


def test_a_collector_the_program_turned_off_gets_no_collection_or_freeze(env, py):
    env["MEMGOV_CLAIM"] = "1GiB"
    result = py("import gc\ngc.disable()\n" + COLLECTIONS_IN_IMPORT, env)
    seen = report(result)
    assert (seen["during"], seen["full"], seen["on"]) == (0, 0, False)


def test_a_fork_while_the_share_is_decided_leaves_the_childs_collector_on(env, py):
    """Another thread forks while memgov decides the share as `import torch` begins (the
    collector off): the pause is recorded before the collector goes off, so the at-fork hook
    finds it."""
    env["MEMGOV_CLAIM"] = "1GiB"
    code = """
import gc, os, threading
from memgov import _autoenable
inside, forked, seen = threading.Event(), threading.Event(), []
decide = _autoenable._decide_threads


def slow():
    inside.set()
    forked.wait(30)
    return decide()


_autoenable._decide_threads = slow


def forker():
    inside.wait(30)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(gc.isenabled()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    seen.append(os.read(read, 10).decode())
    forked.set()


thread = threading.Thread(target=forker)
thread.start()
import torch
thread.join()
print(seen[0], gc.isenabled())
"""
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True"]


def test_only_the_governed_import_freezes_not_one_that_ends_after_it(env, py, tmp_path: Path):
    """A second framework import in another thread began before the governed one and ends
    after it: its end freezes nothing, so what the program made meanwhile stays collectable."""
    env.update(
        MEMGOV_CLAIM="1GiB",
        PYTHONPATH=fake_jax(
            tmp_path,
            "import os, time\nopen(os.environ['STARTED'], 'w').close()\n"
            "while not os.path.exists(os.environ['GO']):\n    time.sleep(0.01)\n",
        ),
        STARTED=str(tmp_path / "started"),
        GO=str(tmp_path / "go"),
    )
    code = """
import gc, os, threading, time, weakref
thread = threading.Thread(target=lambda: __import__("jax"))
thread.start()
while not os.path.exists(os.environ["STARTED"]):
    time.sleep(0.01)
import torch
class Node: pass
a, b = Node(), Node()
a.o, b.o = b, a
gone = weakref.ref(a)
open(os.environ["GO"], "w").close()
thread.join()
del a, b
gc.collect()
print(gone() is None, gc.isenabled())
"""
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True"]


def test_a_later_claim_names_itself_in_the_cpu_share_record(env, py):
    """The share is decided once per process; each claim after it names itself in the share's
    record (`memgov status` shows a claim's threads by it), not the first, released one."""
    env.update(MEMGOV_CLAIM="1GiB")
    code = (
        "import torch, memgov\nmemgov.current().release()\nsecond = memgov.claim('512MiB')\n"
        + holder_is("second")
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True"]
