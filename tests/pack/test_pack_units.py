"""The pack library's parts: manifest checks, the peak history, job environments, figures."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memgov import _autoenable
from memgov._base import settings as _settings
from memgov._base.errors import LedgerError
from memgov.pack import config, history, jobenv, manifest, stats
from memgov.pack.jobs import Job, JobSpec, classify
from memgov.pack.monitor import JobSample
from memgov.pack.runners import Runner

from ._util import MNIST, mnist_args, report, run_pack

MiB = 2**20


# -- manifest ----------------------------------------------------------------------------------
def _manifest(tmp_path: Path, text: str) -> Path:
    (tmp_path / "experiment.toml").write_text(text)
    return tmp_path


GOOD_FW = '[frameworks.torch]\ncommand = ["{python}", "t.py", "--epochs", "{epochs}"]\n'


def test_bundled_manifest_loads() -> None:
    man = manifest.load(MNIST)
    assert man.name == "mnist" and set(man.frameworks) == {"torch", "tensorflow", "jax"}
    argv = man.command("jax", python="py", epochs=2, batch=16, device="cpu")
    assert argv == ["py", "train_jax.py", "--epochs", "2", "--batch", "16", "--device", "cpu"]
    assert man.rogue(64) == ["--hog-mib", "64"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name = ", "not valid TOML"),
        (GOOD_FW, "missing [experiment] table"),
        ('[experiment]\nname = "a b"\n' + GOOD_FW, "accepted 1-64 letters"),
        ('[experiment]\nname = "x"\nreport = "xml"\n' + GOOD_FW, "accepted jsonl-stdout"),
        ('[experiment]\nname = "x"\ncolour = 1\n' + GOOD_FW, "unknown key(s) ['colour']"),
        (
            '[experiment]\nname = "x"\n[frameworks.torch]\ncommand = "python t.py"\n',
            "accepted a non-empty list of non-empty strings",
        ),
        (
            '[experiment]\nname = "x"\n[frameworks.torch]\ncommand = ["{py}", "t.py"]\n',
            "unknown placeholder {py}",
        ),
        (
            '[experiment]\nname = "x"\n[defaults]\nepochs = 0\n' + GOOD_FW,
            "[defaults] epochs = 0: accepted a whole number >= 1",
        ),
        (
            '[experiment]\nname = "x"\nrogue_args = ["--hog"]\n' + GOOD_FW,
            "with a {mib} placeholder",
        ),
        (
            '[experiment]\nname = "x"\n[frameworks.torch]\ncommand = ["a"]\nenv = {A = 1}\n',
            'accepted a table of NAME = "value" strings',
        ),
    ],
)
def test_manifest_errors_say_what_is_accepted(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.load(_manifest(tmp_path, text))
    assert says in str(caught.value) and str(tmp_path) in str(caught.value)


AS_ON_PYTHON_310 = """
import json, sys, types
import tomllib as parser
if sys.argv[1] == "with-tomli":  # a stand-in with tomli's API (tomllib is tomli, upstreamed)
    tomli = types.ModuleType("tomli")
    tomli.loads, tomli.TOMLDecodeError = parser.loads, parser.TOMLDecodeError
    sys.modules["tomli"] = tomli
else:
    sys.modules["tomli"] = None  # not installed
sys.modules["tomllib"] = None  # 3.10 has no tomllib
sys.version_info = (3, 10, 14, "final", 0)
from memgov.pack import manifest
try:
    found = manifest.load(sys.argv[2])
    print(json.dumps({"name": found.name, "parser": manifest.tomllib.__name__}))
except manifest.ManifestError as exc:
    print(json.dumps({"error": str(exc)}))
"""


@pytest.mark.parametrize("tomli", ["with-tomli", "without"])
def test_on_python_310_manifests_are_read_with_tomli(tomli: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", AS_ON_PYTHON_310, tomli, str(MNIST)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(done.stdout)
    if tomli == "with-tomli":
        assert got == {"name": "mnist", "parser": "tomli"}
    else:
        assert "needs tomli, a dependency of memgov-gpu there" in got["error"]
        assert "pip install 'tomli>=1.1'" in got["error"]


def test_tomli_is_a_dependency_before_python_311() -> None:
    import tomllib
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((MNIST.parents[1] / "pyproject.toml").read_text())
    needs = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    tomli = [r for r in needs if r.name == "tomli"]
    assert len(tomli) == 1 and tomli[0].marker is not None
    assert tomli[0].marker.evaluate({"python_version": "3.10"})
    assert not tomli[0].marker.evaluate({"python_version": "3.11"})
    assert pyproject["project"]["requires-python"] == ">=3.10"


def test_missing_epochs_default_is_asked_for(tmp_path: Path) -> None:
    folder = _manifest(tmp_path, '[experiment]\nname = "x"\n' + GOOD_FW)
    done = run_pack("--device", "cpu", str(folder), timeout=60)
    assert done.returncode == 2 and "has no [defaults] epochs; pass --epochs N" in done.stderr


# -- history (--claim auto) --------------------------------------------------------------------
def test_history_margin_and_keep() -> None:
    key = history.key("mnist", "torch", 32)
    assert key == "mnist-torch-b32" and history.read(key) == [] and history.auto_size(key) is None
    history.record(key, [800 * MiB, 884 * MiB], mode="claim")
    size, source = history.auto_size(key) or (0, "")
    # max peak x 1.10 + 64 MiB, rounded up to a whole MiB: 884 * 1.1 + 64 = 1036.4 -> 1037 MiB
    assert size == 1037 * MiB == history.margin(884 * MiB)
    assert "peak 884 MiB over 2 runs of mnist-torch-b32 + 10 % + 64 MiB" in source
    history.record(key, [100 * MiB] * (history.KEEP + 5))
    kept = history.read(key)
    assert len(kept) == history.KEEP and {p["bytes"] for p in kept} == {100 * MiB}


def _store(ledger: Path) -> Path:
    return ledger / "v1" / "_profiles" / str(os.geteuid())


def test_history_is_the_profile_store_and_never_follows_a_symlink(
    private_ledger: Path, tmp_path: Path
) -> None:
    from memgov._profiles import store as _profiles

    history.record("warm-up", [MiB])  # one store: pack's peaks are a job's profile
    assert _profiles.read("warm-up") is not None
    target = tmp_path / "elsewhere.json"
    target.write_text('{"peaks": [{"bytes": 1}]}')
    os.symlink(target, _store(private_ledger) / _profiles.file_name("evil"))
    with pytest.raises(LedgerError, match="symlink"):
        history.read("evil")


def test_history_writes_whole_files_and_a_held_lock_fails_not_hangs(
    private_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from memgov._base import config as _config
    from memgov._profiles import store as _profiles

    history.record("k", [MiB])
    folder = _store(private_ledger)
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert files == [".lock", _profiles.file_name("k")]  # no temporary left
    assert json.loads((folder / _profiles.file_name("k")).read_text())["version"] == 1
    monkeypatch.setattr(_config, "LOCK_TIMEOUT_S", 0.2)
    with open(folder / ".lock") as held:  # e.g. a writer that was stopped (SIGSTOP)
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(LedgerError, match="held for over"):
            history.record("k", [2 * MiB])
    assert [p["bytes"] for p in history.read("k")] == [MiB]


def test_claim_auto_uses_recorded_peaks(tmp_path: Path) -> None:
    history.record(history.key("mnist", "torch", 32), [900 * MiB])
    out = tmp_path / "out"
    done = run_pack(*mnist_args(out, n=1))
    assert done.returncode == 0, done.stderr
    # The people's summary: one column per run, one row per figure.
    assert "samples/s, all jobs" in done.stdout and str(out / "report.json") in done.stdout
    data = report(out)
    assert [r["role"] for r in data["runs"]] == ["main"]  # --n 1 is its own one-job run
    expected = history.margin(900 * MiB)
    assert data["claim"]["bytes"] == expected and "of mnist-torch-b32" in data["claim"]["source"]
    assert data["jobs"][0]["claim_mib"] == expected / MiB  # the job claimed exactly that
    assert data["history"] is None  # a CPU pack measures no GPU peak, so records none


def test_a_claim_the_sampler_missed_is_taken_from_the_jobs_own_report() -> None:
    """A short job on a loaded host can claim and exit between two ledger samples."""

    def record(sample: JobSample, claim: object) -> tuple[object, object, object]:
        job = Job(JobSpec(0, "job-00", ["t"], {}), events=[{"event": "start", "claim": claim}])
        got = stats.job_record(job, sample, Runner())
        return got["claim_mib"], got["claim_mode"], got["claim_seen"]

    reported = {"bytes": 1024 * MiB, "mode": "soft"}
    assert record(JobSample(), reported) == (1024.0, "soft", "job")
    seen = JobSample(claim_bytes=2048 * MiB, claim_mode="hard")
    assert record(seen, reported) == (2048.0, "hard", "ledger")  # the ledger's view first
    for malformed in (None, "1GiB", {"bytes": "1GiB"}, {"bytes": True}, {"bytes": -5}, [1]):
        assert record(JobSample(), malformed)[::2] == (None, None), malformed


# -- job environments --------------------------------------------------------------------------
def test_jobs_never_inherit_a_job_setting_of_packs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every setting the table marks as decided per job, whatever rows it gains later."""
    for name in _settings.names(job=True):
        monkeypatch.setenv(name, "1")
    for mode in config.MODES:
        assert not set(_settings.names(job=True)) & set(jobenv.inherited(mode))


def test_greedy_jobs_get_framework_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("MEMGOV_CLAIM", "2GiB"),
        ("OMP_NUM_THREADS", "3"),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1G"),
        ("MEMGOV_DATA_CACHE", "/c"),
        ("PYTORCH_ALLOC_CONF", "per_process_memory_fraction:0.1"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("GPU_PORTION", "0.5"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
    ):
        monkeypatch.setenv(name, value)
    env = {
        **jobenv.inherited("greedy"),
        **jobenv.decided(jobenv.JobEnv(mode="greedy", ledger=Path("/l"), visible="GPU-1")),
    }
    for gone in (
        "MEMGOV_CLAIM",
        "OMP_NUM_THREADS",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "MEMGOV_THREADS",
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "GPU_PORTION",
        "NVIDIA_GPU_MEMORY_LIMIT",
    ):
        assert gone not in env
    assert not _autoenable.triggered(env)  # auto-enable stays asleep in a greedy job
    assert env["MEMGOV_DATA_CACHE"] == "/c" and env["CUDA_VISIBLE_DEVICES"] == "GPU-1"


def test_claim_jobs_are_governed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    env = {
        **jobenv.inherited("claim"),
        **jobenv.decided(
            jobenv.JobEnv(
                mode="claim",
                claim=str(1037 * MiB),
                threads=2,
                ledger=Path("/l"),
                simulated="sim0:16GiB",
                mps_pipe=Path("/l/mps/pipe"),
                mps_log=Path("/l/mps/log"),
                wait=30.0,
            )
        ),
    }
    assert env["MEMGOV_CLAIM"] == str(1037 * MiB) and env["MEMGOV_STRICT"] == "1"
    # The job's own memgov sets the thread variables (marked as memgov's, not the user's).
    assert env["MEMGOV_THREADS"] == "2" and not any(v in env for v in jobenv.THREAD_VARS)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/l/mps/pipe" and "MEMGOV_MPS" not in env
    assert env["MEMGOV_WAIT"] == "30" and env["MEMGOV_DEVICES"] == "sim0:16GiB"
    no_mps = jobenv.decided(jobenv.JobEnv(mode="growth", threads=1, ledger=Path("/l")))
    assert no_mps["MEMGOV_CLAIM"] == "growth" and no_mps["MEMGOV_MPS"] == "off"


def test_jobs_under_mps_spread_over_the_daemons_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def env() -> dict[str, str]:
        return jobenv.decided(
            jobenv.JobEnv(mode="claim", claim=str(MiB), ledger=Path("/l"), mps_pipe=Path("/p"))
        )

    monkeypatch.delenv("MEMGOV_MPS_POLICY", raising=False)
    assert env()["MEMGOV_MPS_POLICY"] == "spread"
    monkeypatch.setenv("MEMGOV_MPS_POLICY", "fill")
    assert "MEMGOV_MPS_POLICY" not in env()  # the user's own setting reaches the job


# -- reasons and figures -----------------------------------------------------------------------
DONE = [{"event": "start"}, {"event": "done"}]


@pytest.mark.parametrize(
    ("events", "code", "sig", "tail", "stopped", "reason"),
    [
        (DONE, 0, None, [], None, None),
        (
            [{"event": "error", "kind": "oom", "message": "OutOfMemoryError: x"}],
            3,
            None,
            [],
            None,
            "oom",
        ),
        (
            [{"event": "error", "kind": "cuda", "message": "AcceleratorError"}],
            4,
            None,
            [],
            None,
            "cuda_error",
        ),
        (
            [{"event": "error", "kind": "other", "message": "BudgetExceeded: cannot claim"}],
            1,
            None,
            [],
            None,
            "budget_refused",
        ),
        ([], 1, None, ["memgov.BudgetExceeded: cannot claim 1 GiB"], None, "budget_refused"),
        ([], None, signal.SIGKILL, [], None, "killed"),
        ([], 3, None, [], None, "oom"),
        ([], None, signal.SIGTERM, [], "timeout", "timeout"),
        ([], 0, None, ["bye"], None, "error"),
    ],
)
def test_classify(
    events: list[dict[str, object]],
    code: int | None,
    sig: int | None,
    tail: list[str],
    stopped: str | None,
    reason: str | None,
) -> None:
    assert classify(events, code, sig, tail, stopped)[0] == reason


def _job(label: str, spans: list[list[float]]) -> dict[str, object]:
    return {"label": label, "epoch_spans": spans}


def test_aggregate_counts_the_window_where_all_jobs_ran() -> None:
    # a trains 100 samples over 0-10 s, b 100 samples over 5-15 s: both run during 5-10 s,
    # when each does 10 samples/s; over the whole 0-15 s span 200 samples make 13.3/s.
    jobs = [_job("a", [[0.0, 10.0, 100]]), _job("b", [[5.0, 15.0, 100]])]
    got = stats.aggregate(jobs, all_at_once=True)
    assert got["aggregate_samples_per_s"] == 20.0 and got["window_s"] == 5.0
    assert got["aggregate_samples_per_s_span"] == round(200 / 15, 4)
    waves = stats.aggregate(jobs, all_at_once=False)
    assert waves["aggregate_samples_per_s"] == round(200 / 15, 4)
    assert waves["aggregate_basis"] == "span (jobs ran in waves)"


def test_slowdown_and_x_one_job_describe_the_same_seconds() -> None:
    """README's 2 jobs on 2 cores: job b started late and its last epoch ran alone. Alone, one
    job does 100 samples/s; while both ran, each did 50. The summary must say 2x slower and 1x
    one job (2 jobs / 2), not "slowdown 1.75" from epochs partly run alone next to "x one job 1"."""
    a = [[0.0, 20.0, 1000], [20.0, 40.0, 1000]]
    b = [[5.0, 25.0, 1000], [25.0, 45.0, 1000], [45.0, 55.0, 1000]]  # 45-55: alone, 100/s
    jobs = [
        {**_job("a", a), "steady_samples_per_s": 50.0, "steady_epoch_s": 20.0},
        {**_job("b", b), "steady_samples_per_s": 2000 / 30, "steady_epoch_s": 15.0},
    ]
    run = {"epoch_s": 17.5, **stats.aggregate(jobs, all_at_once=True)}
    assert run["window_s"] == 35.0 and run["per_job_samples_per_s"] == 50.0
    solo = {"jobs": [{"steady_samples_per_s": 100.0, "steady_epoch_s": 10.0}]}
    got = stats.compare(run, solo)
    assert got["speedup"] == 1.0 and got["slowdown"] == 2.0  # 2 jobs x 1/2 speed each
    # in waves there is no common window: each job's steady rate, against the solo's
    waves = {"epoch_s": 17.5, **stats.aggregate(jobs, all_at_once=False)}
    assert stats.compare(waves, solo)["slowdown"] == round(100 / ((50 + 2000 / 30) / 2), 4)


# -- runners -----------------------------------------------------------------------------------
def test_docker_run_line_shares_the_ledger_and_replaces_the_entrypoint() -> None:
    from memgov.pack.runners import DockerRunner

    runner = DockerRunner("memgov-mnist", Path("/srv/ledger"), "GPU-abc", Path("/srv/ledger/mps"))
    argv, _env, name = runner.launch(
        ["python", "train_torch.py", "--epochs", "1"],
        {"MEMGOV_CLAIM": "1073741824", "CUDA_VISIBLE_DEVICES": "GPU-abc"},
        Path("/x/mnist"),
        "job-03",
        {"PATH": "/bin"},
    )
    line = " ".join(argv)
    assert argv[:3] == ["docker", "run", "--rm"] and name is not None and name in argv
    assert "-v /srv/ledger:/srv/ledger" in line and "-v /x/mnist:/experiment" in line
    assert "--gpus device=GPU-abc" in line and "--ipc=host" in line
    assert "-e MEMGOV_CLAIM=1073741824" in line and "CUDA_VISIBLE_DEVICES" not in line
    assert line.endswith("--entrypoint python memgov-mnist train_torch.py --epochs 1")
    greedy = " ".join(runner.launch(["python", "t.py"], {}, Path("/x"), "job-00", {})[0])
    assert "-e MEMGOV_CLAIM=off" in greedy and "-e XLA_PYTHON_CLIENT_PREALLOCATE=true" in greedy


def test_a_failure_detail_is_one_line_that_says_what_to_do() -> None:
    # What torch raised when a 49th client met a full MPS server: the error's text, then the C++
    # frames of where it was raised (40 lines of them on the H200).
    frames = "\n".join(f"frame #{i}: 0x7f00 in libc10_cuda.so" for i in range(40))
    message = (
        "AcceleratorError: CUDA error: all CUDA-capable devices are busy or unavailable\n"
        "Search for `cudaErrorDevicesUnavailable' in the CUDA docs\n"
        f"Exception raised from c10_cuda_check_implementation at CUDAException.cpp:44\n"
        f"{frames}"
    )
    reason, detail = classify(
        [{"event": "error", "kind": "cuda", "message": message}], 1, None, [], None
    )
    assert reason == "mps_clients" and detail is not None
    assert "\n" not in detail and "frame #" not in detail
    assert "busy or unavailable" in detail and "--mps-daemons" in detail
    long = "OutOfMemoryError: " + "x" * 1000
    _, oom = classify(
        [{"event": "start"}, {"event": "error", "kind": "oom", "message": long}], 3, None, [], None
    )
    assert oom is not None and len(oom) <= 300 and oom.endswith("...")


# -- runners by name -------------------------------------------------------------------------


def test_runners_are_looked_up_by_name(tmp_path: Path) -> None:
    from memgov.pack import runners

    request = runners.RunnerRequest(framework="torch", ledger=tmp_path)
    for name in runners.RUNNERS:
        assert runners.make(name, request).name == name
    with pytest.raises(runners.RunnerError, match="--runner 'podman': accepted process, "):
        runners.make("podman", request)


def test_pack_reaches_no_private_state_of_the_core() -> None:
    """pack asks the core through its functions (a forked job starts auto-enable with
    _autoenable.start_preloaded), never through its private variables."""
    root = Path(__file__).resolve().parents[2] / "memgov" / "pack"
    reached = [
        f"{path.name}: {hit}"
        for path in sorted(root.glob("*.py"))
        for hit in re.findall(r"\b_autoenable\._\w+", path.read_text())
    ]
    assert not reached, reached
