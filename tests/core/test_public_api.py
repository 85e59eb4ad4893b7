"""The public surface: what users import from memgov, catch from it, and type-check against."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import memgov
import memgov.adapter
from memgov._base import errors as _errors
from memgov._gpu.mpsctl import MpsError

ERRORS = sorted(
    name
    for name in memgov.__all__
    if isinstance(getattr(memgov, name), type) and issubclass(getattr(memgov, name), Exception)
)


def test_every_exception_memgov_raises_on_purpose_is_exported() -> None:
    # memgov/_base/errors.py holds the core's errors; each is exported (pack's, Ray's and the
    # exporter's are exported from their packages: tests/core/test_errors.py).
    defined = sorted(
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type) and issubclass(value, memgov.MemgovError)
    )
    assert defined == ERRORS and {"MpsError", "LockTimeout", "QueueError"} <= set(defined)
    assert memgov.MpsError is MpsError  # what `memgov mps` and pack's --mps on raise
    assert all(issubclass(getattr(memgov, name), memgov.MemgovError) for name in ERRORS)


@pytest.mark.parametrize("name", ERRORS)
def test_errors_pickle_with_their_facts(name: str) -> None:
    # A worker's error reaches its parent through pickle (multiprocessing, Ray).
    cls = getattr(memgov, name)
    if cls is memgov.BudgetExceeded:
        error = cls("no room", device="GPU-1", requested=3, free=1, holders=[("a", 2)])
    else:
        error = cls("what went wrong; accepted: this")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and str(copy) == str(error) and vars(copy) == vars(error)


def test_the_adapter_contract_names_exist() -> None:
    assert all(hasattr(memgov.adapter, name) for name in memgov.adapter.__all__)


def test_importing_memgov_stays_cheap() -> None:
    # The exports are lazy: `import memgov` loads no MPS, ledger or CLI module and no framework.
    code = "import sys, memgov; print(' '.join(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMGOV_", "CUDA_", "SLURM_"))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    loaded = set(out.stdout.split())
    assert {m for m in loaded if m.startswith("memgov")} == {
        "memgov",
        "memgov._base",
        "memgov._base.errors",
        "memgov._base.sizes",
    }
    assert not loaded & {"torch", "tensorflow", "jax", "typer", "rich", "psutil", "pynvml"}


def test_type_hints_ship() -> None:
    # PEP 561 marker, shipped as package data (pyproject.toml).
    assert (Path(memgov.__file__).parent / "py.typed").is_file()
    import memgov_torch

    assert (Path(memgov_torch.__file__).parent / "py.typed").is_file()
