"""memgov: share one NVIDIA GPU between many training processes, safely.

    import memgov
    claim = memgov.claim("2GiB")   # reserve 2 GiB on the first visible GPU; frameworks keep to it

Importing memgov imports no framework and never initialises CUDA or NVML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memgov._errors import (
    BudgetExceeded,
    ConfigError,
    LedgerError,
    MemgovError,
    NoDeviceError,
)
from memgov._sizes import format_size, parse_size

__version__ = "0.1.0"
__all__ = [
    "BudgetExceeded",
    "Claim",
    "ConfigError",
    "Device",
    "LedgerError",
    "MemgovError",
    "NoDeviceError",
    "__version__",
    "claim",
    "current",
    "devices",
    "format_size",
    "parse_size",
]

if TYPE_CHECKING:
    from memgov._claim import Claim, claim, current
    from memgov._devices import Device, devices

_LAZY = {
    "Claim": "memgov._claim",
    "claim": "memgov._claim",
    "current": "memgov._claim",
    "Device": "memgov._devices",
    "devices": "memgov._devices",
}


def __getattr__(name: str) -> Any:
    # Lazy so that `import memgov` stays cheap (it can run in every interpreter, see auto-enable).
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'memgov' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
