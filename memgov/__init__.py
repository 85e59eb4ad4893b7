"""memgov: share one NVIDIA GPU between many training processes, safely.

    import memgov
    claim = memgov.claim("2GiB")   # reserve 2 GiB on the first visible GPU; frameworks keep to it

Importing memgov imports no framework and never initialises CUDA or NVML.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from memgov._base import note_env_set
from memgov._base.errors import (
    BudgetExceeded,
    ConfigError,
    LedgerError,
    LockTimeout,
    MemgovError,
    MpsError,
    NoDeviceError,
    ProfileError,
    QueueError,
)
from memgov._base.sizes import format_size, parse_size

__version__ = "0.1.0"
__all__ = [
    "BudgetExceeded",
    "Claim",
    "ConfigError",
    "Device",
    "LedgerError",
    "LockTimeout",
    "MemgovError",
    "MpsError",
    "NoDeviceError",
    "ProfileError",
    "QueueError",
    "__version__",
    "claim",
    "current",
    "devices",
    "format_size",
    "parse_size",
]

if TYPE_CHECKING:
    from memgov._claim import Claim, claim, current
    from memgov._gpu.devices import Device, devices

# The promise of importing memgov, budget or not: no framework grabs the whole GPU up front.
# Environment only (read when TensorFlow / JAX start their GPU runtime), and setdefault, so an
# explicit setting of the user's always wins. docs/auto-enable.md.
NO_GREEDY_PREALLOCATION = {
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
}
note_env_set([n for n in NO_GREEDY_PREALLOCATION if n not in os.environ])
for _name, _value in NO_GREEDY_PREALLOCATION.items():
    os.environ.setdefault(_name, _value)
del _name, _value

_LAZY = {
    "Claim": "memgov._claim",
    "claim": "memgov._claim",
    "current": "memgov._claim",
    "Device": "memgov._gpu.devices",
    "devices": "memgov._gpu.devices",
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
