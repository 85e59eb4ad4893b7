"""What a governed process sees of its device: the budget, through torch's ``mem_get_info`` and
pynvml's ``nvmlDeviceGetMemoryInfo`` (docs/adapters.md, "What a governed process sees").

No GPU here: each test runs a real process that claims on a simulated device ("sim0") with a
stand-in pynvml (tests/adapters/views_nvml, nvidia-ml-py's shape) that knows the same device, and
gives CPU torch the driver's figures CUDA would (CPU torch's own mem_get_info raises). What the
test checks is the arithmetic the wrappers do on those figures, and that they are undone at
release. benchmarks/gpu/views_checks.py checks the same figures against a real GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

G, M = 2**30, 2**20
FAKE_NVML = Path(__file__).parent / "views_nvml"

CHILD = r"""
import json, os, sys
G, M = 2**30, 2**20
own, neighbour, driver_free, reserved = (int(a) for a in sys.argv[1:5])
nvml_first = sys.argv[5] == "nvml-first"
with open(os.environ["FAKE_NVML_STATE"], "w") as f:  # this process and a busy neighbour
    json.dump({"devices": [{"uuid": "sim0", "total": 16 * G, "used": 0}],
               "processes": {"sim0": {str(os.getpid()): own, "1": neighbour}}}, f)
import torch

def driver(device=None):  # what CUDA's cudaMemGetInfo would give torch on this card
    return driver_free, 16 * G

torch.cuda.mem_get_info = torch.cuda.memory.mem_get_info = driver
if reserved:  # torch has started CUDA, and its caching allocator holds `reserved`
    torch.cuda.is_initialized = lambda: True
    torch.cuda.current_device = lambda: 0
    torch.cuda.memory_reserved = lambda device=None: reserved
if nvml_first:
    import pynvml
import memgov
claim = memgov.claim("4GiB")
import pynvml
from memgov._gpu import nvml as _nvml
handle = pynvml.nvmlDeviceGetHandleByUUID("sim0")

def figures():
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    return {
        "torch": list(torch.cuda.mem_get_info()),
        "torch0": list(torch.cuda.memory.mem_get_info(0)),
        "torch_other": list(torch.cuda.mem_get_info(1)),
        "v1": [v1.total, v1.free, v1.used],
        "v2": [v2.total, v2.reserved, v2.free, v2.used],
        "memgov_own": list(_nvml.memory("sim0")),
    }

seen = {"claimed": figures()}
claim.release()
seen["released"] = figures()
print(json.dumps(seen))
"""


def _run(
    tmp_path: Path,
    own: int = 1 * G,
    neighbour: int = 10 * G,
    driver_free: int = 15 * G,
    reserved: int = 0,
    order: str = "claim-first",
    **env: str,
) -> dict[str, Any]:
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "MEMGOV_DIR": str(tmp_path / "ledger"),
        "MEMGOV_DEVICES": "sim0:16GiB",
        "FAKE_NVML_STATE": str(tmp_path / "nvml.json"),
        "PYTHONPATH": str(FAKE_NVML),
        **env,
    }
    args = [str(own), str(neighbour), str(driver_free), str(reserved), order]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen


def _card(own: int, neighbour: int) -> list[int]:
    used = own + neighbour
    return [16 * G, 16 * G - used, used]


@pytest.mark.parametrize("order", ["claim-first", "nvml-first"])
def test_inside_a_claim_torch_and_nvml_report_the_budget(tmp_path: Path, order: str) -> None:
    # NVML names this process at 1 GiB (context included); a neighbour's 10 GiB does not leak in.
    seen = _run(tmp_path, order=order)
    claimed = seen["claimed"]
    assert claimed["torch"] == claimed["torch0"] == [3 * G, 4 * G]
    assert claimed["v1"] == [4 * G, 3 * G, 1 * G]
    assert claimed["v2"] == [4 * G, 0, 3 * G, 1 * G]
    assert claimed["torch_other"] == [15 * G, 16 * G]  # another device: the driver's figures
    assert claimed["memgov_own"] == [16 * G, 11 * G]  # memgov itself reads the card


def test_release_gives_the_devices_own_figures_back(tmp_path: Path) -> None:
    released = _run(tmp_path)["released"]
    assert released["torch"] == released["torch0"] == [15 * G, 16 * G]
    assert released["v1"] == _card(1 * G, 10 * G)
    assert released["v2"][2] == 5 * G


def test_views_off_leave_the_cards_figures(tmp_path: Path) -> None:
    seen = _run(tmp_path, MEMGOV_VIEWS="off")
    assert seen["claimed"] == seen["released"]
    assert seen["claimed"]["torch"] == [15 * G, 16 * G]
    assert seen["claimed"]["v1"] == _card(1 * G, 10 * G)


def test_torch_counts_its_cache_and_the_overhead_it_keeps(tmp_path: Path) -> None:
    # Torch's allocator holds 512 MiB, and its cap keeps 700 + 160 MiB (no measurement on a
    # simulated device) for context and libraries: more than NVML's 1 GiB, so that counts.
    # Both views agree: free is what the allocator can still be given.
    seen = _run(tmp_path, reserved=512 * M)["claimed"]
    used = 512 * M + 700 * M + 160 * M
    assert seen["torch"] == [4 * G - used, 4 * G]
    assert seen["v1"] == [4 * G, 4 * G - used, used]


def test_nvml_figure_counts_when_larger_than_torchs_estimate(tmp_path: Path) -> None:
    # NVML sees 2 GiB (a library's own cudaMalloc, outside torch's allocator): that counts.
    seen = _run(tmp_path, own=2 * G, reserved=256 * M)["claimed"]
    assert seen["torch"] == [2 * G, 4 * G]
    assert seen["v1"] == [4 * G, 2 * G, 2 * G]


def test_free_is_never_more_than_the_device_has(tmp_path: Path) -> None:
    # Neighbours past their budgets left 1 GiB on the card: both views say 1 GiB, not 3.
    seen = _run(tmp_path, neighbour=14 * G, driver_free=1 * G)["claimed"]
    assert seen["torch"] == [1 * G, 4 * G]
    assert seen["v1"] == [4 * G, 1 * G, 3 * G]


def test_a_bad_views_setting_says_what_it_accepts(tmp_path: Path) -> None:
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "MEMGOV_DIR": str(tmp_path / "ledger"),
        "MEMGOV_DEVICES": "sim0:16GiB",
        "MEMGOV_VIEWS": "sometimes",
    }
    done = subprocess.run(
        [sys.executable, "-c", "import memgov; memgov.claim('1GiB')"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "MEMGOV_VIEWS" in done.stderr and "'sometimes'" in done.stderr
    assert "accepted 1/true/yes/on or 0/false/no/off" in done.stderr


@pytest.mark.parametrize("value", ["on", "off"])
def test_doctor_says_what_a_governed_process_sees(tmp_path: Path, value: str) -> None:
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "MEMGOV_DIR": str(tmp_path / "ledger"),
        "MEMGOV_DEVICES": "sim0:16GiB",
        "MEMGOV_VIEWS": value,
    }
    done = subprocess.run(
        [sys.executable, "-m", "memgov", "doctor"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    views = [line for line in done.stdout.splitlines() if line.startswith("views: ")]
    if value == "off":
        assert views == [
            "views: off (MEMGOV_VIEWS): a governed process sees the card's own figures"
        ]
    else:
        assert "total = the budget" in views[0] and "nvidia-smi" in views[1]
