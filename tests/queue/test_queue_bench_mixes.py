"""The queue benchmark's job files (benchmarks/queue/make_mixes.py) are queue files as docs/queue.md
defines them, hold the light and random mixes the benchmark needs, and are the same for the same
seed. Read with tomllib alone (the engine's own reader checks them too where it is installed);
nothing is run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as tomli (a dependency there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
QUEUE = ROOT / "benchmarks" / "queue"
sys.path.insert(0, str(QUEUE))
from kinds import BIG_FAMILIES, KINDS, SMALL  # noqa: E402

JOB_KEYS = {"name", "cmd", "cwd", "claim", "arrival", "duration", "kind", "env", "gpu"}
SIZING = ROOT / "results" / "h200/2026-11-24-queue-sizing.txt"


def make(out: Path, examples: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(QUEUE / "make_mixes.py"),
            str(out),
            "--examples",
            str(examples),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stand-ins for the PyTorch examples' scripts: the files only need to exist here."""
    root = tmp_path_factory.mktemp("examples")
    for name in ("mnist", "vae", "dcgan"):
        (root / name).mkdir()
        (root / name / "main.py").write_text("raise SystemExit('a stand-in')\n")
    return root


@pytest.fixture(scope="module")
def gpu_mixes(tmp_path_factory: pytest.TempPathFactory, examples: Path) -> Path:
    out = tmp_path_factory.mktemp("mixes")
    done = make(out, examples, "--seed", "3")
    assert done.returncode == 0, done.stderr
    return out


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = tomllib.loads(path.read_text())
    assert set(data) == {"queue", "job"}
    return data["queue"], data["job"]


def check_jobs(path: Path, jobs: list[dict[str, Any]]) -> None:
    """Every job as the queue format accepts it, its folder made, its script there."""
    assert len({j["name"] for j in jobs}) == len(jobs)
    arrivals = [j["arrival"] for j in jobs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    for job in jobs:
        assert set(job) <= JOB_KEYS, job
        assert job["kind"] in KINDS
        assert isinstance(job["cmd"], list) and all(isinstance(a, str) for a in job["cmd"])
        assert Path(job["cmd"][1]).is_file(), job["cmd"]
        assert (path.parent / job["cwd"]).is_dir()
        assert job["claim"] == "auto"
        assert isinstance(job["duration"], float) and job["duration"] > 0
        assert all(isinstance(v, str) for v in job.get("env", {}).values())
        if KINDS[job["kind"]].mnist_data:  # torchvision's MNIST, offline, at ../data
            raw = path.parent / job["cwd"] / ".." / "data" / "MNIST" / "raw"
            assert (raw / "train-images-idx3-ubyte").is_file()


def test_the_light_mix_is_thirty_small_jobs_of_three_kinds_or_more(gpu_mixes: Path) -> None:
    queue, jobs = load(gpu_mixes / "light.toml")
    assert queue == {"policy": "memgov"}
    assert len(jobs) == 30
    check_jobs(gpu_mixes / "light.toml", jobs)
    kinds = {j["kind"] for j in jobs}
    assert kinds <= set(SMALL) and len(kinds) >= 3
    assert sum(j["duration"] for j in jobs) <= 320  # one at a time, it fits a device call


def test_the_random_mix_does_not_fit_one_h200_at_once(gpu_mixes: Path) -> None:
    _, jobs = load(gpu_mixes / "random.toml")
    assert len(jobs) == 30
    check_jobs(gpu_mixes / "random.toml", jobs)
    big = [j for j in jobs if KINDS[j["kind"]].big]
    assert {KINDS[j["kind"]].family for j in big} == set(BIG_FAMILIES)
    assert {"transformer", "gan", "resnet"} <= set(BIG_FAMILIES)
    assert all(8 * 1024 <= KINDS[j["kind"]].peak_mib <= 30 * 1024 for j in big)
    assert sum(KINDS[j["kind"]].peak_mib for j in jobs) > 143_771  # an H200's whole memory
    assert sum(j["duration"] for j in jobs) <= 340


def test_the_engine_reads_the_files_where_it_is_installed(gpu_mixes: Path) -> None:
    queuefile = pytest.importorskip("memgov.queue.queuefile")
    for mix in ("light", "random"):
        assert len(queuefile.load(gpu_mixes / f"{mix}.toml").jobs) == 30


def test_the_same_seed_writes_the_same_jobs(
    tmp_path: Path, examples: Path, gpu_mixes: Path
) -> None:
    data = ("--data", str(gpu_mixes / "data"))  # MNIST's files, linked (writing them is slow)
    again = make(tmp_path / "again", examples, "--seed", "3", *data)
    other = make(tmp_path / "other", examples, "--seed", "4", "--mix", "random", *data)
    assert again.returncode == 0 and other.returncode == 0, again.stderr + other.stderr
    for mix in ("light", "random"):
        assert load(tmp_path / "again" / f"{mix}.toml") == load(gpu_mixes / f"{mix}.toml")
    assert load(tmp_path / "other" / "random.toml") != load(gpu_mixes / "random.toml")


def test_tiny_mixes_run_on_a_cpu(tmp_path: Path, examples: Path, gpu_mixes: Path) -> None:
    done = make(
        tmp_path,
        examples,
        "--tiny",
        "--jobs",
        "8",
        "--min-per-kind",
        "1",
        "--data",
        str(gpu_mixes / "data"),
    )
    assert done.returncode == 0, done.stderr
    for mix in ("light", "random"):
        _, jobs = load(tmp_path / f"{mix}.toml")
        check_jobs(tmp_path / f"{mix}.toml", jobs)
        for job in jobs:
            assert "--accel" not in job["cmd"] and "gpu" not in job["cmd"]
            assert job["cmd"][2:-2] == list(KINDS[job["kind"]].tiny_args)


def test_measured_claims_are_the_peak_and_the_profiles_margin(
    tmp_path: Path, examples: Path, gpu_mixes: Path
) -> None:
    done = make(
        tmp_path,
        examples,
        "--mix",
        "random",
        "--claims",
        "measured",
        "--measured",
        str(SIZING),
        "--data",
        str(gpu_mixes / "data"),
    )
    assert done.returncode == 0, done.stderr
    measured = [json.loads(x) for x in SIZING.read_text().splitlines() if x.startswith("{")]
    peaks = {
        m["kind"]: max(m["nvml_peak_mib"] or 0, m["torch_peak_reserved_mib"] or 0)
        for m in measured
        if m["rc"] == 0
    }
    _, jobs = load(tmp_path / "random.toml")
    for job in jobs:
        peak = peaks.get(job["kind"], KINDS[job["kind"]].peak_mib)
        assert job["claim"] == f"{math.ceil(peak * 1.10 + 64)}MiB", job["kind"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--mix", "heavy"], "accepted a comma-separated list of light, random"),
        (["--kinds", "mnist,bert"], "accepted a comma-separated list of mnist"),
        (["--jobs", "0"], "--jobs 0: accepted a whole number >= 1"),
        (["--big-share", "2"], "--big-share 2.0: accepted a number from 0 to 1"),
        (["--measured", "/nonexistent.json"], "no such file"),
        (["--data", "/nonexistent"], "no MNIST/raw folder in it"),
        (["--mix", "random", "--min-total-gib", "100000"], "no draw of 30 jobs"),
    ],
)
def test_bad_options_are_refused_with_what_is_accepted(
    tmp_path: Path, examples: Path, args: list[str], says: str
) -> None:
    done = make(tmp_path / "out", examples, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr
    assert not (tmp_path / "out" / "random.toml").exists()


def test_missing_example_scripts_are_named(tmp_path: Path) -> None:
    done = make(tmp_path / "out", tmp_path / "nowhere")
    assert done.returncode == 2
    assert "missing" in done.stderr and "mnist/main.py" in done.stderr
    assert "or --kinds without" in done.stderr
    assert not (tmp_path / "out").exists()


def test_summarize_ranks_policies_against_the_exclusive_baseline(tmp_path: Path) -> None:
    def report(policy: str, makespan: float, slowdowns: list[float]) -> dict[str, Any]:
        jobs = [
            {"name": f"j{i}", "slowdown": s, "end": "ok", "jct_s": makespan / (i + 1)}
            for i, s in enumerate(slowdowns)
        ]
        return {
            "policy": policy,
            "makespan_s": makespan,
            "jobs": jobs,
            "ooms": 0,
            "killed_by_neighbour": 0,
            "decisions": {"max_ms": 3.5},
            "device": {"name": "x"},
        }

    paths = []
    for policy, makespan, slow in (
        ("memgov", 140.0, [1.0] * 9 + [1.6]),
        ("sjf-exclusive", 300.0, [1.0] * 10),
        ("fifo", 137.0, [1.2] * 10),
    ):
        paths.append(tmp_path / f"{policy}.json")
        paths[-1].write_text(json.dumps(report(policy, makespan, slow)))
    done = subprocess.run(
        [sys.executable, str(QUEUE / "summarize.py"), "--mix", "light", "--json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = {r["policy"]: r for r in result["rows"]}
    assert [r["policy"] for r in result["rows"]] == ["sjf-exclusive", "memgov", "fifo"]
    assert rows["memgov"]["ratio"] == round(140 / 300, 3)
    assert rows["memgov"]["p90_slowdown"] == 1.0  # nearest rank: 9 of 10 at or below 1.0
    jct = round(sum(140.0 / (i + 1) for i in range(10)) / 10, 2)
    assert rows["memgov"]["mean_jct_s"] == jct
    # within 3 % of fifo's makespan (137 s) and of its mean JCT (lower than memgov's by 2.1 %)
    assert (
        "memgov goal: makespan within 3% of the best simple policy's (137.0 s): met"
        in (result["goals"])
    )
    assert any(g.startswith("memgov goal: mean JCT within 3%") for g in result["goals"])
