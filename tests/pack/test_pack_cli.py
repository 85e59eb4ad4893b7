"""`memgov pack` end to end on CPU through the real CLI: report.json, report.csv, plot.png."""

from __future__ import annotations

import csv
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import memgov_without

from ._util import MNIST, TINY, mnist_args, report, run_pack

KEYS = (
    "n",
    "ok",
    "failed",
    "jobs",
    "footprint_mib",
    "epoch_s",
    "aggregate_samples_per_s",
    "device_peak_used_mib",
)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_cpu_pack_of_two_jobs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_pack(
        "--n",
        "2",
        "--device",
        "cpu",
        str(MNIST),
        "--epochs",
        "1",
        "--out",
        str(out),
        "--rogue",
        "1:64",
        "--json",
        *TINY,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    data = report(out)
    assert printed["jobs"] == data["jobs"]
    for key in KEYS:
        assert key in data, key
    assert (data["n"], data["ok"], data["failed"]) == (2, 2, 0)
    assert data["footprint_mib"] is None and data["device_peak_used_mib"] is None  # no NVML
    assert data["epoch_s"] > 0 and data["aggregate_samples_per_s"] > 0
    assert 0 < data["ready_s"] <= data["ready_s_max"]
    assert data["interrupted"] is False and data["mps"]["used"] is False
    assert data["claim"]["mib"] == 1024 and "no measured peaks" in data["claim"]["source"]
    assert [r["role"] for r in data["runs"]] == ["solo", "main"]
    for run in data["runs"]:  # each run's capacity estimate, and no internal key left in it
        assert run["capacity"]["jobs_fit"]["gpu_memory_by_claim"] >= 2
        assert not [k for k in run if k.startswith("_")]
    assert data["solo"]["n"] == 1 and data["speedup"] is not None
    # Fast by default: each of the 2 jobs gets half the cores; on CPU the solo job gets the same
    # (a fair reference: with every core it ran slower than a packed job, docs/pack.md).
    cores = len(os.sched_getaffinity(0))
    assert data["threads_per_job"] == max(1, cores // 2)
    assert data["solo"]["threads_per_job"] == max(1, cores // 2)
    for job in data["jobs"]:
        assert job["status"] == "ok" and job["reason"] is None and job["exit_code"] == 0
        assert job["epochs_done"] == 1 and len(job["epoch_s"]) == 1 and job["samples"] == 256
        # Its start-up: launch to the trainer's "start" report, which pack read before the
        # first epoch's (both timed as pack reads them: a stalled reader can read them together).
        assert 0 < job["ready_s"] <= job["epoch_spans"][0][1] - job["started_s"] + 0.01
        assert set(job["ready_parts_s"]) == {"interpreter", "data", "framework"}
        # The job really was governed: the ledger held its claim, matched by PID.
        assert job["claim_mib"] == 1024 and job["claim_mode"] == "soft"
        assert job["uss_mib"] and job["rss_mib"] >= job["uss_mib"]
        assert Path(job["log"]).is_file()
    # --rogue 1:64 reaches the last job only (on CPU the trainer has nothing to hog).
    assert [j["rogue_mib"] for j in data["jobs"]] == [None, 64]
    assert "nothing to hog" in Path(data["jobs"][1]["log"]).read_text()

    with open(out / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["run"], r["label"], r["status"]) for r in rows] == [
        ("solo", "job-00", "ok"),
        ("n2", "job-00", "ok"),
        ("n2", "job-01", "ok"),
    ]
    assert all(float(r["epoch_s"]) > 0 and r["claim_mib"] == "1024.0" for r in rows)

    width, height = _png_size(out / "plot.png")
    assert 600 <= width <= 3000 and 400 <= height <= 3000
    assert (out / "plot.png").stat().st_size > 10_000
    assert data["files"]["plot"] == str(out / "plot.png")


def test_parallel_bounds_the_jobs_at_once_and_the_rest_start_as_others_end(
    tmp_path: Path,
) -> None:
    # --parallel is a gate of the engine pack runs on (memgov/queue/engine.py): the third job
    # starts only when one of the first two has ended.
    out = tmp_path / "out"
    done = run_pack(*mnist_args(out, "--parallel", "2", "--no-solo", "--host-per-job", "off", n=3))
    assert done.returncode == 0, done.stderr
    data = report(out)
    assert (data["ok"], data["parallel"], data["aggregate_basis"]) == (
        3,
        2,
        "span (jobs ran in waves)",
    )
    first, second, third = sorted(data["jobs"], key=lambda j: j["started_s"])
    assert third["started_s"] >= min(first["ended_s"], second["ended_s"])
    assert data["decisions"]["count"] >= 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--mode", "fast"], "--mode 'fast': accepted greedy, growth, claim"),
        (["--sweep", "1,x"], "accepted comma-separated job counts"),
        (["--rogue", "3"], "accepted K:MIB"),
        (["--rogue", "5:100"], "accepted K:MIB with 1 <= K <= 2"),
        (["--mode", "greedy", "--claim", "1GiB"], "applies to --mode claim only"),
        (["--threads", "0"], "accepted auto or a whole number"),
        (["--n", "0"], "--n 0: accepted a whole number from 1"),
        (["--mps", "on"], "--mps on needs a GPU"),
        (["--runner", "podman"], "accepted auto, process, namespace, docker"),
        (
            ["--framework", "mxnet"],
            "no [frameworks.mxnet] table; this experiment has jax, tensorflow, torch",
        ),
        (["--claim", "lots"], "cannot read 'lots' as a size"),
        (["--host-per-job", "much"], "or auto (recorded host peaks) or off"),
        (["--baseline", "naive", "--sweep", "1,2"], "--baseline applies to a single --n"),
    ],
)
def test_bad_arguments_are_refused_before_any_job(
    tmp_path: Path, args: list[str], says: str
) -> None:
    out = tmp_path / "out"
    done = run_pack("--device", "cpu", str(MNIST), "--out", str(out), *args, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in done.stderr
    assert not out.exists()  # refused before anything started


def test_bad_experiment_folder(tmp_path: Path) -> None:
    done = run_pack("--device", "cpu", str(tmp_path), timeout=60)
    assert done.returncode == 2
    assert "not an experiment; accepted a folder containing experiment.toml" in done.stderr
    (tmp_path / "experiment.toml").write_text('[experiment]\nname = "x"\n')
    done = run_pack("--device", "cpu", str(tmp_path), timeout=60)
    assert done.returncode == 2 and "missing [frameworks.<name>] tables" in done.stderr


def test_gpu_pack_without_gpu_says_what_to_do(tmp_path: Path) -> None:
    done = run_pack(str(MNIST), "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2
    assert "no GPU is visible" in done.stderr and "--device cpu" in done.stderr


def test_docker_runner_refused_without_an_engine(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is not None:
        info = subprocess.run([docker, "info"], capture_output=True, timeout=30, check=False)
        if info.returncode == 0:
            pytest.skip("a Docker engine answers here; this test covers machines without one")
    done = run_pack(
        "--device",
        "cpu",
        "--runner",
        "docker",
        str(MNIST),
        "--out",
        str(tmp_path / "out"),
        timeout=60,
    )
    assert done.returncode == 2
    assert "--runner docker" in done.stderr
    assert ("no `docker` on PATH" in done.stderr) or ("no container engine answers" in done.stderr)


HIDE_MATPLOTLIB = memgov_without("matplotlib")


def test_without_matplotlib_pack_says_once_how_to_get_the_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["pack", "--n", "1", "--device", "cpu", "--epochs", "1", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-c", HIDE_MATPLOTLIB, *args, "--out", str(out), str(MNIST), *TINY],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=MNIST.parents[1],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = "plot: not drawn: matplotlib is not installed (pip install 'memgov-gpu[plots]')"
    assert done.stdout.count(said) == 1, done.stdout
    assert "ModuleNotFoundError" not in done.stdout + done.stderr
    assert not (out / "plot.png").exists() and report(out)["files"]["plot"] is None
