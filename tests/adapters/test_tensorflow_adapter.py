"""TensorFlow adapter: real tensorflow-cpu for the import-time path, a stand-in for the GPU branch.

TensorFlow cannot run on this project's GPU machines, so its GPU branch is exercised against a
stand-in for ``tf.config`` that raises as TF does once initialised (docs/adapters.md).
"""

from __future__ import annotations

import pytest
from memgov_tensorflow import OVERHEAD, TensorFlowAdapter, configure

from memgov.adapter import Budget

pytest.importorskip("tensorflow", reason="tensorflow-cpu is part of the [all] extra")

GIB, MIB = 2**30, 2**20


def test_real_tf_auto_mode_applies_before_first_op(env, py):
    """Must-show 1: MEMGOV_CLAIM=2GiB python -c "import tensorflow as tf; tf.constant(1)"."""
    env.update(MEMGOV_CLAIM="2GiB", MEMGOV_THREADS="2")
    code = (
        "import tensorflow as tf\nprint(int(tf.constant(1)))\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads())"
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RuntimeError" not in result.stderr
    assert result.stdout.split() == ["1", "2"]
    lines = [x for x in result.stderr.splitlines() if x.startswith("memgov:")]
    assert any("2.00 GiB on sim0" in x for x in lines), result.stderr[-3000:]
    (tf_line,) = [x for x in lines if x.startswith("memgov: tensorflow:")]
    assert "applied: 2 intra-op and inter-op thread(s)" in tf_line
    assert "NOT applied" not in tf_line


def test_real_tf_initialised_first_says_what_was_not_applied(env, py):
    env["MEMGOV_THREADS"] = "2"
    code = (
        "import tensorflow as tf\ntf.constant(1)\nimport memgov\n"
        "held = memgov.claim('2GiB')\nprint(held.reports['tensorflow'])\nprint(int(tf.constant(2)))"
    )
    result = py(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    report, value = result.stdout.strip().splitlines()[-2:]
    assert value == "2"
    assert report.startswith("tensorflow: TensorFlow was already initialised before memgov")
    assert "NOT applied: 2 intra-op and inter-op thread(s)" in report
    assert "memgov: tensorflow: TensorFlow was already initialised" in result.stderr  # logged


# -- the GPU branch, against a stand-in for tf.config ---------------------------------------------


class FakeDevice:
    def __init__(self, index: int) -> None:
        self.name = f"/physical_device:GPU:{index}"
        self.device_type = "GPU"


class FakeConfig:
    """The parts of tf.config memgov calls, raising as TF 2.21 does once initialised."""

    class LogicalDeviceConfiguration:
        def __init__(self, memory_limit: int) -> None:
            self.memory_limit = memory_limit

    def __init__(self, gpus: int, initialized: bool = False) -> None:
        self.gpus = [FakeDevice(i) for i in range(gpus)]
        self.initialized = initialized
        self.growth: dict[str, bool] = {}
        self.logical: dict[str, list[int]] = {}
        self.threads: dict[str, int] = {}
        self.experimental = self
        self.threading = self

    def _check(self, what: str) -> None:
        if self.initialized:
            raise RuntimeError(f"{what} cannot be modified after being initialized")

    def list_physical_devices(self, kind: str) -> list[FakeDevice]:
        return self.gpus if kind == "GPU" else []

    def set_memory_growth(self, dev: FakeDevice, enable: bool) -> None:
        if dev.name in self.logical:
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        self._check("Physical devices")
        self.growth[dev.name] = enable

    def set_logical_device_configuration(self, dev: FakeDevice, configs: list) -> None:
        self._check("Virtual devices")
        self.logical[dev.name] = [c.memory_limit for c in configs]

    def set_intra_op_parallelism_threads(self, n: int) -> None:
        self._check("Intra op parallelism")
        self.threads["intra"] = n

    def set_inter_op_parallelism_threads(self, n: int) -> None:
        self._check("Inter op parallelism")
        self.threads["inter"] = n

    def get_intra_op_parallelism_threads(self) -> int:
        return self.threads.get("intra", 0)

    def get_inter_op_parallelism_threads(self) -> int:
        return self.threads.get("inter", 0)


def budget(size: int | None, threads: int | None = None, simulated: bool = False) -> Budget:
    return Budget(size, "GPU-x", 16 * GIB, 0, simulated, "t", threads=threads)


def test_cap_mode_sets_a_logical_device_below_the_budget():
    config = FakeConfig(gpus=1)
    report = configure(config, budget(2 * GIB, threads=3), initialized=False)
    assert config.logical == {"/physical_device:GPU:0": [(2 * GIB - OVERHEAD) // MIB]}
    assert config.growth == {}  # TF refuses growth together with a logical configuration
    assert config.threads == {"intra": 3, "inter": 3}
    assert "GPU:0 capped at 1448 MiB" in report and "NOT applied" not in report


def test_cap_mode_names_the_ungoverned_gpus():
    config = FakeConfig(gpus=2)
    report = configure(config, budget(4 * GIB), initialized=False)
    assert list(config.logical) == ["/physical_device:GPU:0"]
    assert "1 other visible GPU(s) not governed" in report


def test_growth_mode_on_every_gpu():
    config = FakeConfig(gpus=2)
    report = configure(config, budget(None), initialized=False)
    assert config.growth == {"/physical_device:GPU:0": True, "/physical_device:GPU:1": True}
    assert config.logical == {}
    assert "memory growth on 2 GPU(s) (growth only)" in report


def test_simulated_budget_gives_growth_not_a_cap():
    config = FakeConfig(gpus=1)
    configure(config, budget(2 * GIB, simulated=True), initialized=False)
    assert config.logical == {} and config.growth == {"/physical_device:GPU:0": True}


def test_initialised_reports_everything_not_applied():
    config = FakeConfig(gpus=1, initialized=True)
    report = configure(config, budget(2 * GIB, threads=2), initialized=True)
    assert config.logical == {} and config.threads == {}
    assert "already initialised" in report
    assert "NOT applied: 2 intra-op and inter-op thread(s), memory cap from the 2.00 GiB" in report


def test_initialised_between_check_and_call_is_reported_not_raised():
    config = FakeConfig(gpus=1, initialized=True)
    report = configure(config, budget(2 * GIB), initialized=False)
    assert "NOT applied: memory cap from the 2.00 GiB budget (Virtual devices cannot" in report


def test_growth_env_is_a_default_only(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")
    TensorFlowAdapter().configure_env(budget(None))
    import os

    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
