"""`memgov queue simulate` in a real process: --json shape, text, and errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.helpers.procs import run_memgov

ROOT = Path(__file__).resolve().parents[2]


def memgov(*args: str) -> subprocess.CompletedProcess[str]:
    return run_memgov("queue", *args, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


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
    assert done.returncode == 2 and "accepted memgov, fifo, fifo-exclusive" in done.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,x,1,0,0\n")
    done = memgov("simulate", "--trace", str(bad), *args[2:])
    assert done.returncode == 2 and "cpu_milli='x'; accepted a whole number" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_trace_cut_short_is_refused_not_half_read(tmp_path: Path) -> None:
    args = files(tmp_path)
    cut = tmp_path / "cut.csv"  # the download stopped in a row's optional last column
    cut.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "p0,2000,1024,1,500,T4\np1,4000,2048,1,1000"
    )
    done = memgov("simulate", "--trace", str(cut), *args[2:])  # was read as a whole trace
    assert done.returncode == 2, done.stdout
    assert "line 3: 5 field(s) where the header names 6" in done.stderr, done.stderr
    long = tmp_path / "long.csv"
    long.write_text(
        (tmp_path / "trace.csv").read_text().replace("p1,4000,2048,1,1000", "p1,4,2,1,1000,7")
    )
    done = memgov("simulate", "--trace", str(long), *args[2:])
    assert done.returncode == 2 and "line 3: 6 field(s) where the header names 5" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_trace_with_no_gpu_job_is_refused_at_once(tmp_path: Path) -> None:
    args = files(tmp_path)
    cpu_only = tmp_path / "cpu.csv"
    cpu_only.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,2000,1024,0,0\n")
    done = memgov("simulate", "--trace", str(cpu_only), *args[2:])  # hung before (inflation)
    assert done.returncode == 2, done.stdout
    assert "ask for no GPU" in done.stderr and "at least one GPU job" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_trace_saved_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    args = files(tmp_path)
    plain = memgov("simulate", *args, "--json")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "trace.csv").read_bytes())
    marked = memgov("simulate", "--trace", str(bom), *args[2:], "--json")
    assert plain.returncode == 0 and marked.returncode == 0, marked.stderr
    keep = ("arrived", "placed", "failed", "final_percent")
    assert [json.loads(marked.stdout)[k] for k in keep] == [
        json.loads(plain.stdout)[k] for k in keep
    ]
