"""`memgov queue simulate` in a real process: --json shape, text, and errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def memgov(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "memgov", "queue", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def files(tmp_path: Path) -> list[str]:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "p0,2000,1024,1,500\np1,4000,2048,1,1000\np2,1000,0,0,0\np3,2000,512,2,1000\n"
    )
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,2,T4\nn1,32000,65536,4,G2\n"
    )
    return ["--trace", str(trace), "--nodes", str(nodes)]


def test_simulate_json_has_stable_keys(tmp_path: Path) -> None:
    done = memgov("simulate", *files(tmp_path), "--policy", "fgd", "--seed", "3", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) >= {
        "policy",
        "seed",
        "arrived",
        "placed",
        "failed",
        "total_gpus",
        "final_percent",
        "curve",
        "seconds",
    }
    assert data["policy"] == "fgd" and data["seed"] == 3 and data["total_gpus"] == 6
    assert data["placed"] + data["failed"] == data["arrived"]
    assert all(k.isdigit() for k in data["curve"]) and data["final_percent"] > 0


def test_simulate_prints_the_curve_for_people(tmp_path: Path) -> None:
    done = memgov("simulate", *files(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "policy memgov, seed 42" in done.stdout and "final allocation:" in done.stdout


def test_bad_input_exits_2_saying_what_is_accepted(tmp_path: Path) -> None:
    args = files(tmp_path)
    done = memgov("simulate", *args, "--policy", "nope")
    assert done.returncode == 2 and "accepted random, dotprod" in done.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,x,1,0,0\n")
    done = memgov("simulate", "--trace", str(bad), *args[2:])
    assert done.returncode == 2 and "cpu_milli='x'; accepted a whole number" in done.stderr
    assert "Traceback" not in done.stderr
