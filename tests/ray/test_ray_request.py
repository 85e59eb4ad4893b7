"""memgov.ray's requests and node resources, without a cluster (cheap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memgov._base.errors import ConfigError
from memgov.ray._request import build, cluster_types, type_resource
from tests.helpers.procs import memgov_without


def test_importing_memgov_ray_imports_no_ray() -> None:
    code = "import sys, memgov, memgov.ray; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("budget", "gpu", "fraction", "mib"),
    [
        ("2GiB", "16GiB", 0.125, 2048),
        ("1GiB", "80GiB", 0.0125, 1024),
        ("3000MiB", "80GiB", 0.0367, 3000),  # 0.036621... rounded up, never down
        ("25%", "16GiB", 0.25, 4096),  # a percentage of the GPU type
        ("16GiB", "16GiB", 1.0, 16384),
        (1, "16GiB", 0.0001, 1),  # one byte still takes one MiB and Ray's smallest unit
    ],
)
def test_fraction_is_rounded_up_to_ray_precision(
    budget: str | int, gpu: str, fraction: float, mib: int
) -> None:
    request = build(budget, gpu, None, None)
    assert request.fraction == fraction
    assert request.budget_mib == mib
    assert request.fraction * request.capacity_mib >= request.budget_mib
    assert request.ray_options()["resources"] == {
        "gpu_memory": float(mib),
        type_resource(request.capacity_mib): fraction,
    }


def test_a_gpu_type_by_marker_name_and_the_cluster_types() -> None:
    assert build("1GiB", "memgov_gpu_81303MiB", None, None).capacity_mib == 81303
    found = cluster_types({"CPU": 4, "GPU": 3, "gpu_memory": 1, "memgov_gpu_16384MiB": 2})
    assert found == [16384]


@pytest.mark.parametrize(
    ("budget", "gpu", "known", "wait", "message"),
    [
        ("lots", "16GiB", None, None, "cannot read .lots. as a size; accepted"),
        ("17GiB", "16GiB", None, None, "can never fit"),
        ("1GiB", "big", None, None, "names a GPU type"),
        ("1GiB", None, None, None, "gpu= is needed when Ray is not initialised"),
        ("1GiB", None, [], None, "declares memgov GPU resources"),
        ("1GiB", None, [16384, 81920], None, "several GPU types"),
        ("1GiB", "40GiB", [16384], None, "no node of this cluster declares"),
        ("1GiB", "16GiB", None, -1, "accepted seconds >= 0"),
        ("1GiB", "16GiB", None, float("nan"), "accepted seconds >= 0"),
        ("1GiB", "16GiB", None, True, "accepted seconds >= 0"),
    ],
)
def test_bad_requests_say_what_is_accepted(
    budget: str, gpu: str | None, known: list[int] | None, wait: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build(budget, gpu, known, wait)  # type: ignore[arg-type]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    memgov_bin = Path(sys.executable).with_name("memgov")
    return subprocess.run([str(memgov_bin), *args], capture_output=True, text=True, env=env)


def test_node_resources_from_the_inventory(env: dict[str, str]) -> None:
    env["MEMGOV_DEVICES"] = "a:16GiB,b:16GiB"
    done = _cli("ray", "node-resources", env=env)
    assert done.returncode == 0, done.stderr
    expected = '{"gpu_memory":32768,"memgov_gpu_16384MiB":2}'
    assert done.stdout.strip() == f"--num-gpus=2 --resources={expected}"
    env["MEMGOV_RESERVE"] = "1GiB"  # the ledger's capacity: total minus the reserve
    data = json.loads(_cli("ray", "node-resources", "--json", env=env).stdout)
    assert data["resources"] == {"gpu_memory": 30720, "memgov_gpu_15360MiB": 2}


def test_node_resources_on_a_mixed_node_declares_the_smallest(env: dict[str, str]) -> None:
    env["MEMGOV_DEVICES"] = "a:16GiB,b:80GiB"
    done = _cli("ray", "node-resources", env=env)
    assert done.returncode == 0
    assert '"memgov_gpu_16384MiB":2' in done.stdout
    assert "declared as the smallest (16384 MiB)" in done.stderr


def test_node_resources_with_garbage_inventory_exits_2(env: dict[str, str]) -> None:
    env["MEMGOV_DEVICES"] = "a:lots"
    done = _cli("ray", "node-resources", env=env)
    assert done.returncode == 2
    assert "MEMGOV_DEVICES" in done.stderr and "Traceback" not in done.stderr


RAY_START_PARSER = """
import json, sys
import click
from ray.scripts.scripts import start  # Ray's own `ray start` command: its argument parsing only
assert sys.argv[1] == "start", sys.argv
try:
    ctx = start.make_context("ray start", sys.argv[2:])
except click.ClickException as exc:
    exc.show()
    sys.exit(exc.exit_code)
params = {k: ctx.params[k] for k in ("address", "num_gpus", "resources")}
params["resources"] = json.loads(params["resources"])  # as `ray start` reads it
print(json.dumps(params))
"""


def test_the_docs_ray_start_line_works_as_written(env: dict[str, str], tmp_path: Path) -> None:
    """docs/ray.md's quick-start line, run by a real shell: $(...) splits the output into words
    without removing quotes, so each flag must be one word that Ray's parser accepts."""
    pytest.importorskip("ray.scripts.scripts")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "ray.md").read_text()
    lines = [ln.strip() for ln in doc.splitlines() if "$(memgov ray node-resources)" in ln]
    assert lines == ["ray start --address HEAD:6379 $(memgov ray node-resources)"], lines
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text(f"#!{sys.executable}\n{RAY_START_PARSER}")
    (fake / "ray").chmod(0o755)
    env["PATH"] = os.pathsep.join([str(fake), str(Path(sys.executable).parent), env["PATH"]])
    env["MEMGOV_DEVICES"] = "a:16GiB,b:16GiB"
    done = subprocess.run(["sh", "-c", lines[0]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "address": "HEAD:6379",
        "num_gpus": 2,
        "resources": {"gpu_memory": 32768, "memgov_gpu_16384MiB": 2},
    }


NO_RAY = memgov_without("ray")


@pytest.mark.parametrize(
    "args",
    [["status"], ["pack", "--device", "cpu", "--n", "1", "experiments/mnist"]],
    ids=["status", "pack"],
)
def test_without_ray_each_ray_command_says_so_in_one_line(
    env: dict[str, str], args: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, "ray", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"memgov ray {args[0]}: needs Ray, which cannot be imported here (No module named 'ray');"
        " install it with pip install 'memgov-gpu[ray]'"
    ]


def test_without_ray_node_resources_still_prints_the_flags(env: dict[str, str]) -> None:
    """It needs no Ray: the flags are for `ray start` on a node that has it."""
    env["MEMGOV_DEVICES"] = "a:16GiB"
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, "ray", "node-resources"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("--num-gpus=1 --resources=")


def test_auto_budget_from_the_jobs_profile_else_a_first_run() -> None:
    import time

    from memgov._profiles import store as _profiles

    first = build("auto", "16GiB", None, None, job="ray:train")
    assert first.budget == 4 * 2**30 and first.job == "ray:train"
    assert first.source.startswith("auto: 4.00 GiB = first run of ray:train")
    run = {
        "peak": 1000 * 2**20,
        "end": "exit",
        "time": time.time(),
        "claim": 4 * 2**30,
        "simulated": False,
    }
    _profiles.record("ray:train", "ray:train", [run])
    learned = build("auto", "16GiB", None, None, job="ray:train")
    assert learned.budget == _profiles.margin(1000 * 2**20)
    assert "peak 1,000 MiB over 1 run of ray:train + 10 % + 64 MiB" in learned.source
    with pytest.raises(ConfigError, match="budget='auto' needs job=NAME"):
        build("auto", "16GiB", None, None)
