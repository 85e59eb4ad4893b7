"""The MNIST experiment as ``memgov pack`` sees it: real trainer processes and their reports.

Everything runs on CPU with tiny inputs; frameworks that are not installed are skipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

MNIST = Path(__file__).resolve().parents[2] / "experiments" / "mnist"
BUNDLED = MNIST / "data" / "mnist.npz"
SHA256 = "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64"
SCRIPTS = {"torch": "train_torch.py", "tensorflow": "train_tensorflow.py", "jax": "train_jax.py"}


def _module(name: str) -> ModuleType:
    # Loaded under a private name: "report" is too generic to claim in a shared test session.
    spec = importlib.util.spec_from_file_location(f"_mnist_exp_{name}", MNIST / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mnist_data = _module("mnist_data")
report = _module("report")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    env["MEMGOV_DATA_CACHE"] = str(tmp_path_factory.mktemp("mnist-cache"))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _events(stdout: str) -> list[dict]:
    # Every stdout line must be a report; json.loads fails the test on anything else.
    return [json.loads(line) for line in stdout.splitlines()]


def test_bundled_data_matches_provenance() -> None:
    assert mnist_data.sha256_of(BUNDLED) == SHA256 == mnist_data.SHA256
    assert SHA256 in (MNIST / "data" / "MNIST-PROVENANCE.md").read_text()


@pytest.mark.parametrize("framework", list(SCRIPTS))
def test_trainer_reports(framework: str, env: dict[str, str]) -> None:
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    cmd = [sys.executable, SCRIPTS[framework], "--epochs", "1", "--limit", "512", "--batch", "32"]
    cmd += ["--device", "cpu", "--eval-limit", "512", "--hog-mib", "1"]
    proc = subprocess.run(cmd, cwd=MNIST, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = _events(proc.stdout)
    # "progress" reports come at most every 2 s within an epoch (a slow machine sends some).
    progress = [e for e in events if e["event"] == "progress"]
    assert all(e["epoch"] == 1 and 0 < e["samples"] < e["of"] == 512 for e in progress)
    assert [e["samples"] for e in progress] == sorted(e["samples"] for e in progress)
    events = [e for e in events if e["event"] != "progress"]
    assert [e["event"] for e in events] == ["start", "epoch", "done"], proc.stdout
    start, epoch, done = events
    assert start["framework"] == framework
    assert start["device"] == "cpu"
    assert isinstance(start["pid"], int)
    assert (start["batch"], start["epochs"], start["train_samples"]) == (32, 1, 512)
    assert "claim" not in start  # not governed: nothing to report
    assert epoch["epoch"] == 1
    assert epoch["seconds"] > 0
    assert epoch["samples"] == 512
    assert epoch["samples_per_s"] > 0
    assert math.isfinite(epoch["loss"]) and epoch["loss"] > 0
    assert 0.0 <= epoch["acc"] <= 1.0
    assert done["epochs"] == 1
    assert 0.0 <= done["test_acc"] <= 1.0
    assert done["total_s"] > 0
    assert done["peak_allocator_mib"] is None  # CPU
    assert "nothing to hog" in proc.stderr


def test_a_governed_trainer_reports_the_claim_it_holds(
    env: dict[str, str], private_ledger: Path
) -> None:
    """A packer that samples the ledger can miss a short job's claim; the job's report has it."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    governed = {
        **env,
        "MEMGOV_DIR": str(private_ledger),
        "MEMGOV_DEVICES": "sim0:8GiB",
        "MEMGOV_CLAIM": "512MiB",
    }
    cmd = [sys.executable, "train_torch.py", "--epochs", "1", "--limit", "64", "--device", "cpu"]
    cmd += ["--eval-limit", "32"]
    proc = subprocess.run(cmd, cwd=MNIST, env=governed, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (start,) = [e for e in _events(proc.stdout) if e["event"] == "start"]
    assert start["claim"] == {"bytes": 512 * 2**20, "mode": "soft"}


def test_sha_mismatch_is_a_clear_error(tmp_path: Path, env: dict[str, str]) -> None:
    bad = tmp_path / "mnist.npz"
    data = bytearray(BUNDLED.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    actual = hashlib.sha256(data).hexdigest()

    with pytest.raises(mnist_data.DataError) as info:
        mnist_data.load(bad, cache_dir=tmp_path / "cache")
    for part in (SHA256, actual, str(bad)):
        assert part in str(info.value)

    # The data is checked before the framework is imported, so this needs no torch.
    cmd = [sys.executable, "train_torch.py", "--data", str(bad), "--device", "cpu"]
    proc = subprocess.run(cmd, cwd=MNIST, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    (event,) = _events(proc.stdout)
    assert event["event"] == "error" and event["kind"] == "other"
    assert SHA256 in event["message"] and actual in event["message"]


RACER = textwrap.dedent(
    """
    import hashlib, json, os, sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import mnist_data
    print("ready", flush=True)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.001)
    arrays = mnist_data.load()
    print(json.dumps({
        "memmap": all(isinstance(a, np.memmap) for a in arrays),
        "digests": [hashlib.sha256(np.ascontiguousarray(a)).hexdigest() for a in arrays],
    }), flush=True)
    """
)


def test_cache_extraction_survives_racing_processes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    env = dict(os.environ, MEMGOV_DATA_CACHE=str(cache))
    cmd = [sys.executable, "-c", RACER, str(MNIST), str(go)]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    try:
        for p in procs:  # all interpreters up and waiting, then release them at once
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            results.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()

    with np.load(BUNDLED) as npz:
        expected = [
            hashlib.sha256(np.ascontiguousarray(npz[k]).data).hexdigest() for k in mnist_data.ARRAYS
        ]
    assert all(r["memmap"] for r in results)
    assert all(r["digests"] == expected for r in results)
    (folder,) = cache.iterdir()
    assert folder.name == f"mnist-{SHA256[:16]}"
    assert sorted(f.name for f in folder.iterdir()) == sorted(f"{k}.npy" for k in mnist_data.ARRAYS)


def test_damaged_cache_file_is_replaced(tmp_path: Path) -> None:
    x_train = mnist_data.load(cache_dir=tmp_path)[0]
    target = tmp_path / f"mnist-{SHA256[:16]}" / "x_train.npy"
    del x_train
    with open(target, "r+b") as f:
        f.truncate(1000)
    assert mnist_data.load(cache_dir=tmp_path)[0].shape == (60000, 28, 28)


def test_batches_cover_every_sample_once() -> None:
    x = np.arange(10 * 2 * 2, dtype=np.uint8).reshape(10, 2, 2)
    y = np.arange(10, dtype=np.uint8)
    seen = []
    for xb, yb in mnist_data.batches(x, y, 4, np.random.default_rng(0), channels_last=False):
        assert xb.dtype == np.float32 and yb.dtype == np.int64
        assert xb.shape[1:] == (1, 2, 2) and len(xb) == len(yb) <= 4
        np.testing.assert_allclose(xb[:, 0, 0, 0] * 255, yb * 4)  # images stay with labels
        seen.extend(yb.tolist())
    assert sorted(seen) == list(range(10)) and seen != list(range(10))
    (xb, _), *_ = mnist_data.batches(x, y, 4)
    assert xb.shape == (4, 2, 2, 1) and float(xb.max()) <= 1.0


class OutOfMemoryError(RuntimeError):  # stands in for torch.OutOfMemoryError
    pass


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"), "oom"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "cuda"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), "cuda"),
        (ValueError("bad shape"), "other"),
        (report.UsageError("--device gpu: torch sees no GPU"), "other"),
    ],
)
def test_error_classification(exc: BaseException, kind: str) -> None:
    assert report.classify(exc) == kind


def test_wrapped_oom_is_found_through_the_cause() -> None:
    try:
        try:
            raise RuntimeError("RESOURCE_EXHAUSTED: OOM when allocating tensor")
        except RuntimeError as inner:
            raise ValueError("step failed") from inner
    except ValueError as outer:
        assert report.classify(outer) == "oom"


FAILING_TRAINER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv.pop(1))
    import harness

    class OutOfMemoryError(RuntimeError):
        pass

    class Trainer:
        device, channels_last = "cuda:0", True
        def __init__(self, args):
            print("framework banner on stdout")
        def train_epoch(self, batches):
            next(batches)
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")

    harness.main("fake", Trainer)
    """
)


def test_oom_is_reported_with_exit_code_3(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAILING_TRAINER)
    cmd = [sys.executable, str(script), str(MNIST), "--limit", "64", "--device", "cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    events = _events(proc.stdout)  # the banner went to stderr, not into the report stream
    assert [e["event"] for e in events] == ["start", "error"]
    assert events[1]["kind"] == "oom" and "Tried to allocate" in events[1]["message"]
    assert "framework banner on stdout" in proc.stderr


def test_barrier_holds_jobs_until_all_are_ready(tmp_path: Path, env: dict[str, str]) -> None:
    """Two trainers with --barrier-n 2: the first waits for the second before its first epoch;
    alone (--barrier-n 3, one never comes) a job goes on after --barrier-timeout."""
    script = SCRIPTS["torch"]
    base = [
        sys.executable,
        script,
        "--epochs",
        "1",
        "--limit",
        "64",
        "--batch",
        "32",
        "--device",
        "cpu",
        "--no-eval",
        "--barrier",
        str(tmp_path / "b"),
    ]
    first = subprocess.Popen(
        [*base, "--barrier-n", "2"],
        cwd=MNIST,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        start = json.loads(first.stdout.readline())
        assert start["event"] == "start"
        time.sleep(1.0)
        assert first.poll() is None  # waiting at the barrier, not training
        second = subprocess.run(
            [*base, "--barrier-n", "2"],
            cwd=MNIST,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        out, _ = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    for text in (out, second.stdout):
        barrier = next(e for e in _events(text) if e["event"] == "barrier")
        assert (barrier["seen"], barrier["wanted"]) == (2, 2)
    waited = next(e for e in _events(out) if e["event"] == "barrier")["waited_s"]
    assert waited >= 1.0  # the first job waited for the second one's start-up
    alone = subprocess.run(
        [*base[:-1], str(tmp_path / "c"), "--barrier-n", "2", "--barrier-timeout", "0.5"],
        cwd=MNIST,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    barrier = next(e for e in _events(alone.stdout) if e["event"] == "barrier")
    assert barrier["seen"] == 1 and barrier["waited_s"] >= 0.5
    assert [e["event"] for e in _events(alone.stdout)] == ["start", "barrier", "epoch", "done"]
