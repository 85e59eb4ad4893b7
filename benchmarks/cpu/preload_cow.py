"""What a job forked by ``--runner preload`` keeps private, and where (CPU, one job at a time).

    python benchmarks/cpu/preload_cow.py > results/cpu-2core/2026-11-23-preload-cow.txt

1. Right after ``import torch`` and one tiny op: private memory (Private_Clean + Private_Dirty of
   /proc/PID/smaps_rollup, i.e. USS) of a job forked from the zygote against the same script
   spawned as a plain process.
2. The MNIST trainer forked from the zygote, after its first epoch: its private memory split into
   pages inside mappings the zygote also has (copied on write, by mapping) and mappings of its
   own (the heap's growth counts as its own: its range differs from the zygote's), and the
   launcher's private memory.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from memgov.pack.preload import PreloadRunner

ROOT = Path(__file__).resolve().parents[2]
PROBE = """\
import json, os, sys, time
import torch
torch.ones(8).sum()
kib = 0
for line in open("/proc/self/smaps_rollup"):
    if line.startswith(("Private_Clean:", "Private_Dirty:")):
        kib += int(line.split()[1])
print(json.dumps({"pid": os.getpid(), "private_mib": round(kib / 1024, 1)}), flush=True)
"""


def regions(pid: int) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    current = ("", "")
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                current = (parts[0], parts[5] if len(parts) > 5 else "[anon]")
                found[current] = 0
            elif parts and parts[0] in ("Private_Dirty:", "Private_Clean:"):
                found[current] += int(parts[1])
    return found


def start(
    runner: PreloadRunner, argv: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.Popen[str]:
    wrapped, full, _ = runner.launch(argv, env, cwd, f"job-{len(argv)}", dict(os.environ))
    return subprocess.Popen(
        wrapped,
        cwd=cwd,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="mgcow", dir="/tmp"))
    (work / "probe.py").write_text(PROBE)
    env = {
        "PYTHONUNBUFFERED": "1",
        "MEMGOV_DATA_CACHE": os.environ.get("MEMGOV_DATA_CACHE", str(work / "cache")),
    }
    print("$ python benchmarks/cpu/preload_cow.py")
    runner = PreloadRunner("torch")
    forked = start(runner, [sys.executable, "probe.py"], work, env)
    assert forked.stdout is not None
    child = json.loads(forked.stdout.readline())
    forked.wait()
    spawned = subprocess.run(
        [sys.executable, "probe.py"],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    print(
        "1. after `import torch` and one op, private MiB (USS): forked",
        child["private_mib"],
        "| spawned",
        json.loads(spawned.stdout)["private_mib"],
    )
    mnist = ROOT / "experiments" / "mnist"
    trainer = start(
        runner,
        [
            sys.executable,
            "train_torch.py",
            "--epochs",
            "2",
            "--device",
            "cpu",
            "--limit",
            "2048",
            "--eval-limit",
            "64",
        ],
        mnist,
        env,
    )
    assert trainer.stdout is not None
    for line in trainer.stdout:
        if '"epoch"' in line:
            break
    zygote = runner._zygote
    assert zygote is not None
    job = runner._child_of(trainer.pid)
    assert job is not None
    theirs = {rng for rng, _name in regions(zygote.pid)}
    mine = regions(job)
    copied = {k: v for k, v in mine.items() if k[0] in theirs}
    own = {k: v for k, v in mine.items() if k[0] not in theirs}
    by_mapping: collections.Counter[str] = collections.Counter()
    for (_rng, name), kib in copied.items():
        by_mapping[os.path.basename(name) if name.startswith("/") else name] += kib
    by_own: collections.Counter[str] = collections.Counter()
    for (_rng, name), kib in own.items():
        by_own[os.path.basename(name) if name.startswith("/") else name] += kib
    print("2. MNIST trainer forked from the zygote, after its first epoch (MiB):")
    print(
        f"   private in all {sum(mine.values()) / 1024:.1f}; in the zygote's mappings (copied)"
        f" {sum(copied.values()) / 1024:.1f}; in its own mappings {sum(own.values()) / 1024:.1f}"
    )
    print(
        "   copied, by mapping:",
        ", ".join(f"{k} {v / 1024:.1f}" for k, v in by_mapping.most_common(6)),
    )
    print("   own, by mapping:", ", ".join(f"{k} {v / 1024:.1f}" for k, v in by_own.most_common(4)))
    print(f"   the launcher: {sum(regions(trainer.pid).values()) / 1024:.1f}")
    trainer.wait()
    runner.cleanup()
    print("   zygote:", json.dumps(runner.summary()))


if __name__ == "__main__":
    main()
