"""Devices: simulated ones from MEMGOV_DEVICES, CUDA_VISIBLE_DEVICES order, device selection."""

from __future__ import annotations

import pytest

import memgov
from memgov._gpu import devices as _devices, nvml as _nvml
from memgov._gpu.devices import candidates, devices

GIB = 2**30


def test_simulated_devices_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", " sim0:16GiB , big.1:80G:2GiB,x_y-z:1024")
    found = devices()
    assert [(d.index, d.uuid, d.total, d.used) for d in found] == [
        (0, "sim0", 16 * GIB, 0),
        (1, "big.1", 80 * GIB, 2 * GIB),
        (2, "x_y-z", 1024, 0),
    ]
    assert all(d.simulated and d.visible_index == d.index for d in found)
    assert found[0].name == "simulated sim0"


MALFORMED_DEVICES = [
    "garbage",
    "sim0",
    "sim0:",
    ":16GiB",
    "sim0:0",
    "sim0:-1G",
    "sim0:16 parsecs",
    "sim0:50%",
    "sim0:16GiB:17GiB",
    "sim0:16GiB:lots",
    "sim0:1G:2G:3G",
    "sim0:1G,sim0:2G",
    "bad name:1G",
    "sim/0:1G",
    "-sim:1G",
    "sim0:1G,",
    "sim0:1G,,sim1:1G",
    "a" * 65 + ":1G",
]


@pytest.mark.parametrize("spec", MALFORMED_DEVICES)
def test_malformed_memgov_devices_is_a_config_error(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", spec)
    with pytest.raises(memgov.ConfigError) as info:
        devices()
    message = str(info.value)
    assert "MEMGOV_DEVICES" in message
    assert "accepted a comma-separated list of NAME:TOTAL[:USED]" in message
    # The same error reaches a claim, before anything is written to the ledger.
    with pytest.raises(memgov.ConfigError):
        memgov.claim("1GiB")


def test_blank_memgov_devices_means_real_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "   ")
    assert _devices.simulated_spec() is None


def test_no_gpu_at_all_says_how_to_simulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMGOV_DEVICES", raising=False)
    monkeypatch.setattr(_nvml, "devices", lambda: [])
    monkeypatch.setattr(_nvml, "unavailable_reason", lambda: "NVMLError_LibraryNotFound")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(memgov.NoDeviceError) as info:
        memgov.claim("1GiB")
    message = str(info.value)
    assert "NVMLError_LibraryNotFound" in message
    assert "CUDA_VISIBLE_DEVICES='0'" in message
    assert 'MEMGOV_DEVICES="sim0:16GiB"' in message


@pytest.fixture
def three(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim-a:8GiB,sim-b:16GiB,other:32GiB")


@pytest.mark.usefixtures("three")
@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (None, ["sim-a"]),
        (0, ["sim-a"]),
        (2, ["other"]),
        ("1", ["sim-b"]),
        ("sim-b", ["sim-b"]),
        ("oth", ["other"]),  # a unique prefix
        ("auto", ["sim-a", "sim-b", "other"]),
        (" AUTO ", ["sim-a", "sim-b", "other"]),
        ("cuda:1", ["sim-b"]),  # as torch and JAX write it (docs: an index as frameworks count)
        ("CUDA:2", ["other"]),
        ("cuda", ["sim-a"]),  # torch's "cuda": its current device, the first
    ],
)
def test_device_selection(selector: int | str | None, expected: list[str]) -> None:
    assert [d.uuid for d in candidates(selector)] == expected


@pytest.mark.usefixtures("three")
@pytest.mark.parametrize(
    ("selector", "error", "text"),
    [
        (3, memgov.NoDeviceError, "sees 3 GPU(s), indices 0..2"),
        ("cuda:3", memgov.NoDeviceError, "device='cuda:3': this process sees 3 GPU(s)"),
        ("banana", memgov.NoDeviceError, 'an index as frameworks count ("1" or "cuda:1")'),
        (-1, memgov.NoDeviceError, "indices 0..2"),
        ("sim", memgov.NoDeviceError, "matches several visible GPU"),
        ("nope", memgov.NoDeviceError, "matches no visible GPU"),
        ("", memgov.ConfigError, "accepted None"),
        (True, memgov.ConfigError, "accepted None"),
        (1.5, memgov.ConfigError, "accepted None"),
    ],
)
def test_bad_device_selectors(selector: object, error: type, text: str) -> None:
    with pytest.raises(error) as info:
        candidates(selector)  # type: ignore[arg-type]
    assert text in str(info.value)


def _nvml_devices() -> list[_nvml.NvmlDevice]:
    return [
        _nvml.NvmlDevice(0, "GPU-aaaa-0000", "H200", 141 * GIB, GIB),
        _nvml.NvmlDevice(1, "GPU-bbbb-1111", "H200", 141 * GIB, GIB),
        _nvml.NvmlDevice(2, "GPU-cccc-2222", "H200", 141 * GIB, GIB),
    ]


@pytest.mark.parametrize(
    ("cvd", "visible"),
    [
        (None, {"GPU-aaaa-0000": 0, "GPU-bbbb-1111": 1, "GPU-cccc-2222": 2}),
        ("2,0", {"GPU-cccc-2222": 0, "GPU-aaaa-0000": 1}),
        ("GPU-bbbb", {"GPU-bbbb-1111": 0}),
        ("1,7,2", {"GPU-bbbb-1111": 0}),  # CUDA stops at the first token that matches nothing
        ("0,0", {"GPU-aaaa-0000": 0}),
        ("", {}),
        ("-1", {}),
    ],
)
def test_cuda_visible_devices_order(
    cvd: str | None, visible: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEMGOV_DEVICES", raising=False)
    monkeypatch.setattr(_nvml, "devices", _nvml_devices)
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    found = devices()
    assert len(found) == 3  # every host GPU is listed, visible or not
    assert {d.uuid: d.visible_index for d in found if d.visible_index is not None} == visible


def test_a_simulated_gpu_cannot_take_the_cpu_share_folders_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # v1/cpu holds the CPU-share records: a GPU named cpu would keep its claims inside them.
    from memgov._base import settings as _settings
    from memgov._cpu import share as _cpushare

    assert _cpushare.PARTS[-1] in _settings.RESERVED_NAMES
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB,cpu:8GiB")
    with pytest.raises(memgov.ConfigError, match="'cpu': the ledger's folder of that name"):
        devices()
    monkeypatch.setenv("MEMGOV_DEVICES", "CPU:8GiB")  # another folder name: accepted
    assert [d.uuid for d in devices()] == ["CPU"]
