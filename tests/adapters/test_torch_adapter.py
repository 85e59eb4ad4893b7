"""The PyTorch adapter on a machine without a GPU: what can be checked here without CUDA.

The cap itself (set_per_process_memory_fraction after CUDA initialises) is proven on the GPU machine
by benchmarks/gpu/torch_claim.py; here we pin down the private API it rests on and the parts that
do not need a device.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from memgov_torch import TorchAdapter, _physical_cores, _state  # noqa: E402

from memgov.adapter import Budget  # noqa: E402

REAL_LOOKING = Budget(
    bytes=2 * 2**30,
    device_uuid="GPU-00000000-0000-0000-0000-000000000000",
    device_total=80 * 2**30,
    device_index=0,
    simulated=False,
    name="test",
)


def test_lazy_call_is_queued_without_initialising_cuda() -> None:
    # torch.cuda._lazy_call is private: this fails loudly on a torch version that drops it.
    queued = len(torch.cuda._queued_calls)
    report = TorchAdapter().apply(REAL_LOOKING)
    assert "when CUDA initialises" in report
    assert len(torch.cuda._queued_calls) == queued + 1
    assert not torch.cuda.is_initialized()


def test_out_of_memory_message_names_the_budget() -> None:
    TorchAdapter().apply(REAL_LOOKING)
    _state["cap"] = 1 * 2**30
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
    text = str(error)
    assert text.startswith("CUDA out of memory")
    assert "memgov: this process's budget is 2.00 GiB" in text
    assert "claim 'test'" in text and "tensors capped at 1.00 GiB" in text


def test_simulated_device_gets_no_cuda_cap() -> None:
    budget = Budget(2**30, "sim0", 16 * 2**30, None, True, "sim")
    assert "no CUDA cap on a simulated device" in TorchAdapter().apply(budget)


def test_claim_then_import_torch_does_not_initialise_cuda(tmp_path) -> None:
    code = (
        "import memgov; c = memgov.claim('1GiB'); import torch;"
        "print(torch.cuda.is_initialized(), c.reports.get('torch'))"
    )
    env = {"MEMGOV_DIR": str(tmp_path), "MEMGOV_DEVICES": "sim0:16GiB", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split()[0] == "False"
    assert "torch:" in out.stdout


# -- the physical cores torch's default thread count is compared with ----------------------------


def test_physical_cores_read_from_sysfs_are_psutils_answer() -> None:
    # The adapter reads sysfs itself (importing psutil cost ~7 ms of every governed start); the
    # answer must stay psutil's, on this machine's real /sys.
    psutil = pytest.importorskip("psutil")
    assert _physical_cores() == psutil.cpu_count(logical=False)


def _topology(root: Path, lists: dict[str, str], file: str = "core_cpus_list") -> None:
    for cpu, siblings in lists.items():
        (root / cpu / "topology").mkdir(parents=True)
        (root / cpu / "topology" / file).write_text(siblings + "\n")


def test_physical_cores_count_the_distinct_sibling_lists(tmp_path: Path) -> None:
    # Two cores of two threads each, and folders psutil's cpu[0-9]* glob does not match.
    _topology(tmp_path, {"cpu0": "0,2", "cpu1": "1,3", "cpu2": "0,2", "cpu3": "1,3"})
    for other in ("cpufreq", "cpuidle", "cpu"):
        (tmp_path / other / "topology").mkdir(parents=True)
        (tmp_path / other / "topology" / "core_cpus_list").write_text(f"{other}\n")
    assert _physical_cores(str(tmp_path)) == 2


def test_physical_cores_from_the_deprecated_file_when_no_cpu_has_the_new_one(
    tmp_path: Path,
) -> None:
    _topology(
        tmp_path, {"cpu0": "0-1", "cpu1": "0-1", "cpu2": "2", "cpu3": "3"}, "thread_siblings_list"
    )
    (tmp_path / "cpu4" / "topology").mkdir(parents=True)  # offline: no topology files
    assert _physical_cores(str(tmp_path)) == 3


def test_physical_cores_fall_back_to_psutil_without_sysfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: None if logical else 7)
    assert _physical_cores(str(tmp_path / "absent")) == 7
    (tmp_path / "cpu0").mkdir()  # a CPU folder without topology: psutil too
    assert _physical_cores(str(tmp_path)) == 7
