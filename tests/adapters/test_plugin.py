"""A new framework is its adapter package and one registration, for every front end alike.

The test writes a toy framework (``toyfw``: a memory-limit setter and a thread setter) and its
adapter (``memgov_toyfw``) into tmp_path, and registers the adapter as a third party would: an
entry point in a ``*.dist-info/entry_points.txt`` on sys.path (PYTHONPATH here). Nothing in
memgov/ names the toy framework (the last test checks), and no memgov file is edited; real
processes then show it governed by ``memgov.claim()``, by auto-enable (``MEMGOV_CLAIM`` and a
script that only imports toyfw) and by ``memgov pack``, which reads the adapter's facts (its
default claim, its own thread variable) as it reads torch's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY_CLAIM = 768 * 2**20
"""The toy adapter's ``Facts.default_claim``: what ``memgov pack --claim auto`` gives a toyfw job
with no history (memgov's own default, for a framework without one, is 1 GiB)."""

PLUGIN = {
    # The framework: it knows nothing of memgov.
    "toyfw/__init__.py": textwrap.dedent(
        """
        LIMIT = None
        THREADS = None

        def set_memory_limit(nbytes):
            global LIMIT
            LIMIT = nbytes

        def set_threads(n):
            global THREADS
            THREADS = n
        """
    ),
    # Its adapter: the one package a new framework adds.
    "memgov_toyfw/__init__.py": textwrap.dedent(
        f"""
        import sys
        from memgov.adapter import Budget, Facts, format_size

        class ToyAdapter:
            name = "toyfw"
            module = "toyfw"
            facts = Facts(env=("TOYFW_THREADS",), default_claim={TOY_CLAIM})

            def configure_env(self, budget: Budget) -> None:
                return None

            def apply(self, budget: Budget) -> str:
                toyfw = sys.modules["toyfw"]
                toyfw.set_memory_limit(budget.bytes)
                if budget.threads:
                    toyfw.set_threads(budget.threads)
                size = "no limit" if budget.bytes is None else format_size(budget.bytes)
                return f"toyfw: memory limit {{size}}, {{budget.threads}} thread(s)"

            def cuda_initialized(self) -> bool:
                return False
        """
    ),
    # Its registration: one entry point.
    "memgov_toyfw-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: memgov-toyfw\n"
    "Version: 1.0\n",
    "memgov_toyfw-1.0.dist-info/entry_points.txt": "[memgov.adapters]\n"
    "toyfw = memgov_toyfw:ToyAdapter\n",
}

TRAINER = """
import json, os, sys, time
import toyfw  # auto-enable governs the job here, as it governs `import torch`

out = sys.argv[sys.argv.index("--out") + 1]
seen = {"limit": toyfw.LIMIT, "threads": toyfw.THREADS,
        "toyfw_threads_env": os.environ.get("TOYFW_THREADS"),
        "memgov_claim": os.environ.get("MEMGOV_CLAIM")}
with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
    json.dump(seen, f)
def emit(**event):
    print(json.dumps(event), flush=True)
emit(event="start", framework="toyfw", device="cpu", pid=os.getpid(), batch=1, epochs=1,
     train_samples=1)
emit(event="epoch", epoch=1, seconds=0.01, samples=1, samples_per_s=100.0, loss=0.0, acc=1.0)
emit(event="done", epochs=1, test_acc=None, total_s=0.01, peak_allocator_mib=None)
"""

MANIFEST = """
[experiment]
name = "toy"
report = "jsonl-stdout"

[defaults]
epochs = 1
batch = 1

[frameworks.toyfw]
command = ["{python}", "train.py", "--out", "OUT"]
"""


@pytest.fixture
def plugin_env(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the toy framework and its adapter on sys.path, as a pip install would put
    them; nothing else changed."""
    plugin = tmp_path / "plugin"
    for relative, text in PLUGIN.items():
        (plugin / relative).parent.mkdir(parents=True, exist_ok=True)
        (plugin / relative).write_text(text)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin), env.get("PYTHONPATH")]))
    return env


def last_json(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_claim_caps_the_toy_framework_through_its_adapter(plugin_env, py):
    code = """
import json, memgov
from memgov import _adapters
from memgov._base import importhook as _importhook
claim = memgov.claim("1GiB")
import toyfw
print(json.dumps({"limit": toyfw.LIMIT, "threads": toyfw.THREADS,
                  "report": claim.reports.get("toyfw"), "hooked": list(_importhook.frameworks()),
                  "adapters": sorted(a.name for a in _adapters.available())}))
"""
    plugin_env["MEMGOV_THREADS"] = "3"
    facts = last_json(py(code, plugin_env))
    assert facts["limit"] == 2**30
    assert facts["threads"] == 3
    assert facts["report"] == "toyfw: memory limit 1.00 GiB, 3 thread(s)"
    assert "toyfw" in facts["hooked"] and "torch" in facts["hooked"]
    assert "toyfw" in facts["adapters"] and "torch" in facts["adapters"]


def test_auto_enable_caps_the_toy_framework_at_its_import(tmp_path, plugin_env):
    script = tmp_path / "job.py"
    script.write_text(
        "import json, toyfw\nprint(json.dumps({'limit': toyfw.LIMIT, 'threads': toyfw.THREADS}))\n"
    )
    plugin_env.update(MEMGOV_CLAIM="1GiB", MEMGOV_THREADS="2", MEMGOV_DEVICES="sim0:8GiB")
    result = subprocess.run(
        [sys.executable, str(script)], env=plugin_env, capture_output=True, text=True, timeout=120
    )
    assert last_json(result) == {"limit": 2**30, "threads": 2}
    assert "at import toyfw]" in result.stderr  # auto-enable's line: the claim, where it took it
    assert "toyfw: memory limit 1.00 GiB, 2 thread(s)" in result.stderr


@pytest.mark.parametrize("mode", ["claim", "greedy"])
def test_pack_runs_toy_jobs_with_the_adapters_facts(tmp_path, plugin_env, mode):
    experiment, out, seen = tmp_path / "toy", tmp_path / "report", tmp_path / "seen"
    experiment.mkdir()
    seen.mkdir()
    (experiment / "train.py").write_text(TRAINER)
    (experiment / "experiment.toml").write_text(MANIFEST.replace("OUT", str(seen)))
    # The toy framework's own thread variable in pack's environment: a governed job keeps it
    # (the user's), a greedy job runs at the framework's defaults without it (the facts' env).
    plugin_env.update(MEMGOV_DEVICES="sim0:8GiB", TOYFW_THREADS="7")
    args = ["--n", "2", "--device", "cpu", "--framework", "toyfw", "--mode", mode]
    args += ["--threads", "1", "--baseline", "none", "--no-progress", "--out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "memgov", "pack", *args, str(experiment)],
        env=plugin_env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = [json.loads(p.read_text()) for p in sorted(seen.glob("*.json"))]
    assert len(jobs) >= 2
    if mode == "greedy":
        assert all(j["limit"] is None and j["toyfw_threads_env"] is None for j in jobs), jobs
        assert all(j["memgov_claim"] is None for j in jobs), jobs
        return
    # Each job claimed the adapter's default claim on the simulated GPU, at `import toyfw`, and
    # its adapter set pack's thread count (--threads 1).
    assert all(j["limit"] == TOY_CLAIM and j["threads"] == 1 for j in jobs), jobs
    assert all(j["memgov_claim"] == str(TOY_CLAIM) for j in jobs), jobs
    assert all(j["toyfw_threads_env"] == "7" for j in jobs), jobs
    claim = json.loads((out / "report.json").read_text())["claim"]
    assert claim["source"].startswith("default for toyfw (768 MiB): no measured peaks"), claim


def test_nothing_in_memgov_names_the_toy_framework():
    named = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "memgov").rglob("*.py")
        if "toyfw" in path.read_text(encoding="utf-8")
    ]
    assert not named
