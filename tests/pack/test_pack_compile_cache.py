"""pack's shared compilation cache (memgov/pack/warmup.py): one warm-up job compiles, the run's jobs
load; the folder rules (yours alone, the user's JAX_COMPILATION_CACHE_DIR wins, off); docker mounts
it. The pack run needs jax (the [jax] extra) and skips without it."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

import pytest

from memgov._base.errors import ConfigError
from memgov.pack import warmup
from memgov.pack.runners import DockerRunner

from ._util import MNIST, TINY, mnist_args, report, run_pack


def test_cache_folder_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert warmup.cache_folder("off", "jax", tmp_path)[0] is None
    folder, why = warmup.cache_folder("auto", "torch", tmp_path)
    assert folder is None and "only jax" in why
    folder, why = warmup.cache_folder("auto", "jax", tmp_path / "out")
    assert folder == (tmp_path / "out" / "compile-cache").resolve() and "report folder" in why
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    mine = tmp_path / "mine"
    assert warmup.cache_folder(str(mine), "jax", tmp_path)[0] == mine.resolve()
    # The user's own JAX_COMPILATION_CACHE_DIR wins over auto.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "users"))
    folder, why = warmup.cache_folder("auto", "jax", tmp_path / "out2")
    assert folder == (tmp_path / "users").resolve() and "JAX_COMPILATION_CACHE_DIR" in why


def test_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ConfigError, match="writable by you alone"):
        warmup.cache_folder(str(shared), "jax", tmp_path)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="accepted auto"):
        warmup.cache_folder(str(a_file), "jax", tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match="must be yours"):
        warmup.cache_folder(str(theirs), "jax", tmp_path)


def test_cache_env_bounds_the_cache_so_jax_locks_it(tmp_path: Path) -> None:
    env = warmup.cache_env(tmp_path, "jax")
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path)
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "-1"
    assert int(env["JAX_COMPILATION_CACHE_MAX_SIZE"]) > 0  # -1 would write without the lock


def test_docker_jobs_get_the_cache_mounted(tmp_path: Path) -> None:
    runner = DockerRunner("img", tmp_path / "ledger", None, None)
    runner.mounts.append(tmp_path / "cache")
    argv, _env, _name = runner.launch(["python", "train_jax.py"], {}, tmp_path, "job-00", {})
    assert f"{tmp_path / 'cache'}:{tmp_path / 'cache'}" in argv


def test_bad_compile_cache_is_a_clear_error_before_any_job(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    done = run_pack(
        "--n",
        "1",
        "--framework",
        "jax",
        "--device",
        "cpu",
        "--no-solo",
        "--compile-cache",
        str(shared),
        str(MNIST),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        *TINY,
    )
    assert done.returncode == 2
    assert "--compile-cache" in done.stderr and "writable by you alone" in done.stderr
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax (the [jax] extra)")
def test_jobs_load_what_the_warm_up_job_compiled(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_pack(
        *mnist_args(
            out, "--framework", "jax", "--no-solo", trainer=["--", "--limit", "64", "--no-eval"]
        ),
        timeout=280,
    )
    assert done.returncode == 0, done.stderr
    data = report(out)
    assert data["compile_cache"]["folder"] == str(out / "compile-cache")
    warm = data["runs"][-1]["warm_up"]
    assert warm["status"] == "warm", warm
    assert warm["prepared"]["cache_misses"] > 0  # the warm-up job compiled and stored
    for job in data["jobs"]:  # every program of the run came from the cache
        assert job["status"] == "ok"
        assert job["prepared"]["cache_misses"] == 0, job["prepared"]
        assert job["prepared"]["cache_hits"] >= warm["prepared"]["cache_misses"]
    assert any(p.name.endswith("-cache") for p in (out / "compile-cache").iterdir())
