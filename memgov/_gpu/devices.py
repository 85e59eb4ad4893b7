"""The GPUs memgov budgets: real ones through NVML, or simulated ones from MEMGOV_DEVICES.

Simulated devices (``MEMGOV_DEVICES="sim0:16GiB,sim1:80GiB"``) replace NVML entirely. They exist so
that memgov, and programs built on it, can be run and tested on machines without a GPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from memgov._base import settings as _settings
from memgov._base.errors import ConfigError, NoDeviceError
from memgov._base.sizes import Size
from memgov._gpu import nvml as _nvml

SIM_FORMAT = _settings.SIM_FORMAT


@dataclass(frozen=True)
class Device:
    """One GPU as memgov sees it."""

    index: int
    """Position in the host's list (NVML's index, or the position in MEMGOV_DEVICES)."""
    uuid: str
    name: str
    total: int
    used: int
    """Bytes in use on the device when it was read, by anyone (NVML); configured for simulated."""
    simulated: bool
    visible_index: int | None
    """The index frameworks in this process would use (cuda:N), or None if hidden from them."""


def simulated_spec() -> str | None:
    """MEMGOV_DEVICES as set (unchecked: :func:`simulated_devices` checks it), or None."""
    raw = os.environ.get("MEMGOV_DEVICES")
    return raw if raw and raw.strip() else None


def simulated_devices(spec: str) -> list[Device]:
    """The devices a MEMGOV_DEVICES value describes (pack also builds its own simulated GPU)."""
    return [
        Device(position, name, f"simulated {name}", total, used, True, position)
        for position, (name, total, used) in enumerate(_settings.simulated(spec))
    ]


def _visible_order(nvml_devices: list[_nvml.NvmlDevice]) -> list[_nvml.NvmlDevice]:
    """The devices CUDA would show this process, in its order, from CUDA_VISIBLE_DEVICES.

    Mirrors CUDA: indices or (prefixes of) UUIDs; the list ends at the first token that matches
    nothing; "" or "-1" hide every GPU.
    """
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return nvml_devices
    order: list[_nvml.NvmlDevice] = []
    for token in (t.strip() for t in raw.split(",")):
        match = None
        if token.isdigit():
            match = next((d for d in nvml_devices if d.index == int(token)), None)
        elif token.startswith("GPU-"):
            hits = [d for d in nvml_devices if d.uuid.startswith(token)]
            match = hits[0] if len(hits) == 1 else None
        if match is None or match in order:
            break
        order.append(match)
    return order


def devices() -> list[Device]:
    """Every GPU on the host (or simulated), with its memory read now."""
    spec = simulated_spec()
    if spec is not None:
        return simulated_devices(spec)
    nvml_devices = _nvml.devices()
    visible = {d.uuid: i for i, d in enumerate(_visible_order(nvml_devices))}
    return [
        Device(d.index, d.uuid, d.name, d.total, d.used, False, visible.get(d.uuid))
        for d in nvml_devices
    ]


def no_gpu_hint() -> str:
    """What to do on a machine where memgov sees no GPU (first contact: status, devices, doctor)."""
    reason = _nvml.unavailable_reason() if simulated_spec() is None else None
    why = f" (NVML: {reason})" if reason else ""
    return (
        f"memgov sees no GPU{why}. On a machine without a GPU, simulate some to try memgov: "
        'MEMGOV_DEVICES="sim0:16GiB" memgov status'
    )


def refresh(device: Device) -> Device:
    """The same device with its memory use read again."""
    if device.simulated:
        return device
    total, used = _nvml.memory(device.uuid)
    return Device(device.index, device.uuid, device.name, total, used, False, device.visible_index)


def candidates(selector: int | str | None) -> list[Device]:
    """The devices a claim may go to: one, or every visible one for "auto" (best fit decides).

    ``selector``: None (the first visible GPU), an index as frameworks count (cuda:N), a UUID or a
    unique UUID prefix, or "auto".
    """
    visible = sorted(
        (d for d in devices() if d.visible_index is not None),
        key=lambda d: d.visible_index or 0,
    )
    if not visible:
        reason = _nvml.unavailable_reason() if simulated_spec() is None else None
        hint = f" (NVML: {reason})" if reason else ""
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint += f" (CUDA_VISIBLE_DEVICES={cvd!r})" if cvd is not None else ""
        raise NoDeviceError(
            "no GPU is visible to this process" + hint + "; on a machine without a GPU, simulate "
            'some with MEMGOV_DEVICES="sim0:16GiB"'
        )
    asked = selector
    if selector is None:
        return visible[:1]
    if isinstance(selector, bool):
        raise ConfigError(f"device={selector!r}: {_DEVICE_ACCEPTED}")
    if isinstance(selector, str) and selector.strip().lower() == "auto":
        return visible
    if isinstance(selector, str):
        # "cuda:N" as torch and JAX write it, "cuda" (torch's current device: the first), or "N".
        ordinal = _CUDA_ORDINAL.fullmatch(selector.strip().lower())
        if ordinal:
            selector = int(ordinal[1] or ordinal[2] or 0)
    if isinstance(selector, int):
        if not 0 <= selector < len(visible):
            raise NoDeviceError(
                f"device={asked!r}: this process sees {len(visible)} GPU(s), indices "
                f"0..{len(visible) - 1} (cuda:0..cuda:{len(visible) - 1})"
            )
        return [visible[selector]]
    if isinstance(selector, str) and selector.strip():
        wanted = selector.strip()
        hits = [d for d in visible if d.uuid == wanted] or [
            d for d in visible if d.uuid.startswith(wanted)
        ]
        if len(hits) == 1:
            return hits
        known = ", ".join(d.uuid for d in visible)
        what = "matches several" if hits else "matches no"
        raise NoDeviceError(
            f"device={selector!r} {what} visible GPU (visible: {known}); {_DEVICE_ACCEPTED}"
        )
    raise ConfigError(f"device={selector!r}: {_DEVICE_ACCEPTED}")


_CUDA_ORDINAL = re.compile(r"cuda(?::(\d+))?|(\d+)")
_DEVICE_ACCEPTED = (
    'accepted None (the first visible GPU), an index as frameworks count ("1" or "cuda:1"), '
    'a GPU UUID or a unique prefix of one, or "auto"'
)


def sizes_on(size: Size, among: list[Device]) -> dict[str, int]:
    """Device UUID -> ``size`` in bytes, for each device of ``among`` that could ever hold it.

    Every path that takes a size for a device checks it here, before anything starts: claim()
    (and so auto-enable), ``memgov run --claim`` and ``memgov pack --claim``. A device too small
    is skipped (device="auto" picks among the others); when none can hold it, a ConfigError
    names the size, the largest device and its size, and what is accepted.
    """
    sizes: dict[str, int] = {}
    for device in among:
        try:
            sizes[device.uuid] = size.on(device.total)
        except ConfigError:
            continue
    if among and not sizes:
        largest = max(among, key=lambda d: d.total)
        where = "the device" if len(among) == 1 else "the largest device,"
        where = f"{where} {largest.uuid}"
        size.on(largest.total, where)  # raises the ConfigError that says so
    return sizes
