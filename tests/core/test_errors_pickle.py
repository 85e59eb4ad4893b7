"""Every memgov exception survives pickling (multiprocessing and Ray send them between
processes), with its message, type and facts."""

from __future__ import annotations

import pickle

import pytest

import memgov
from memgov._base import errors as _errors
from memgov._gpu.mpsctl import MpsError
from memgov.exporter import ExporterUnavailable
from memgov.pack.manifest import ManifestError
from memgov.pack.runners import RunnerError
from memgov.placement.trace import TraceError

SAMPLES = [
    _errors.MemgovError("base"),
    _errors.ConfigError("bad size"),
    _errors.LedgerError("no permission"),
    _errors.LockTimeout("held too long"),
    _errors.NoDeviceError("no gpu"),
    _errors.ProfileError("not a profile"),
    _errors.QueueError("not a queue job"),
    _errors.BudgetExceeded(
        "does not fit", device="sim0", requested=5, free=3, holders=[("a", 2)], queued_ahead=1
    ),
    MpsError("no daemon"),
    ManifestError("bad manifest"),
    RunnerError("no docker"),
    ExporterUnavailable("no prometheus_client"),
    TraceError("trace 'x.csv': no column gpu_milli"),
]


def every_exception_class() -> set[type]:
    found: set[type] = set()
    todo = [_errors.MemgovError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_the_samples_cover_every_memgov_exception() -> None:
    assert every_exception_class() <= {type(e) for e in SAMPLES}


@pytest.mark.parametrize("error", SAMPLES, ids=lambda e: type(e).__name__)
def test_exception_pickles_round_trip(error: Exception) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert vars(back) == vars(error)


def test_a_real_refusal_pickles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:4GiB:3GiB")  # 3 GiB used outside memgov
    with pytest.raises(memgov.BudgetExceeded) as refused:
        memgov.claim("2GiB")
    back = pickle.loads(pickle.dumps(refused.value))
    assert (back.free, back.requested, back.holders) == (
        refused.value.free,
        refused.value.requested,
        refused.value.holders,
    )
