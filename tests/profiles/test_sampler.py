"""What a run's sampler (memgov/_runs.py) costs the process it measures: one wake-up a second,
a blocking wait that finish() cuts short, and NVML asked only while the peak moves, yet the peak
as exact as before. The wait is checked in a real governed process on a simulated GPU; the NVML
pacing in this process, against a fake NVML and a fake torch allocator on a clock the test
drives (a real GPU is not needed to count driver queries)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from typing import Any

import pytest

from memgov import _runs
from memgov._claim import Claim
from memgov._gpu import nvml as _nvml
from memgov.adapter import Budget

MiB = 2**20

WAITING = """
import json, sys, threading, time
from memgov import _runs
import memgov

_runs.SAMPLE_S = 0.05
counts = {"samples": 0, "sleeps": 0}
enough = threading.Event()
sample, sleep = _runs._sample, time.sleep

def counted_sample(run, now=None):
    counts["samples"] += 1
    if counts["samples"] >= 10:
        enough.set()
    return sample(run, now)

def counted_sleep(seconds):
    run = _runs.current()
    if run is not None and threading.get_ident() == run.sampler:
        counts["sleeps"] += 1
    sleep(seconds)

_runs._sample, time.sleep = counted_sample, counted_sleep
claim = memgov.claim("1GiB")
ended = _runs.current().ended
enough.wait(120)
counts["sleeps_in_release"] = 0
sleep_now = time.sleep
def release_sleep(seconds):
    counts["sleeps_in_release"] += 1
    sleep_now(seconds)
time.sleep = release_sleep
claim.release()
time.sleep = sleep_now
first = {**counts, "ended": not ended.locked()}

_runs.SAMPLE_S = 3600.0  # a sleep only finish() can cut short
claim = memgov.claim("1GiB")
ended = _runs.current().ended
claim.release()
print(json.dumps({"first": first, "long_sleep_ended": not ended.locked()}))
"""


def _governed(script: str, env: dict[str, str]) -> dict[str, Any]:
    """Run ``script`` in a governed process of its own; the JSON line it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "MEMGOV_QUIET": "1", "MEMGOV_THREADS": "off"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen


def test_the_sampler_sleeps_in_one_wait_that_finish_cuts_short(env: dict[str, str]) -> None:
    """Ten samples at 50 ms: the sampler thread never polls (the old loop slept 20 ms at a time:
    fifty wake-ups a second against the training loop's main thread); a release ends a sleep of
    an hour at once."""
    seen = _governed(WAITING, env)
    assert seen["first"]["samples"] >= 10
    assert seen["first"]["sleeps"] == 0
    assert seen["first"]["ended"] and seen["long_sleep_ended"]
    assert seen["first"]["sleeps_in_release"] == 0  # it waited for the sampler's end in one wait


CUT_SHORT = """
import json, time
from memgov import _claim, _runs
from memgov._files import flock as _flock
import memgov

_runs.SAMPLE_S = 0.05
claim = memgov.claim("1GiB")
run = _runs.current()
# An interrupt that lands in release() after the budget is back and before the run's end began
# (as Ctrl-C did in tests/hostile's interrupted claims): the run's end is skipped.
_claim._end_run = lambda claim: None
claim.release()
deadline = time.monotonic() + 30
while (run.ended.locked() or not run.held.file.closed) and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({
    "sampler_ended": not run.ended.locked(),
    "file_closed": run.held.file.closed,
    "current": _runs.current() is not None,
    "ledger_files": _flock.open_count(),
    "folded": run.flags.get("finisher") == run.sampler,
}))
"""


def test_a_run_whose_release_was_cut_short_is_ended_by_its_sampler(env: dict[str, str]) -> None:
    """Without it the run's sampler thread and live file lived on until the next claim or the
    process's exit (tests/hostile/test_interrupts.py's descriptor check met it under load)."""
    seen = _governed(CUT_SHORT, env)
    assert seen == {
        "sampler_ended": True,
        "file_closed": True,
        "current": False,
        "ledger_files": 0,
        "folded": True,
    }


# -- NVML pacing, on a fake clock ---------------------------------------------------------------


class FakeGpu:
    """NVML's view of this process and torch's allocator counters, set by the test."""

    def __init__(self) -> None:
        self.nvml_used = 900 * MiB
        self.reserved = 200 * MiB
        self.reserved_peak = 200 * MiB
        self.looks = 0

    def processes(self, uuid: str) -> dict[int, int | None]:
        self.looks += 1
        return {os.getpid(): self.nvml_used}

    def torch(self) -> Any:
        stats = lambda: {  # noqa: E731
            "reserved_bytes.all.current": self.reserved,
            "reserved_bytes.all.peak": self.reserved_peak,
        }
        cuda = types.SimpleNamespace(is_initialized=lambda: True, memory_stats=stats)
        return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu()
    monkeypatch.setattr(_nvml, "processes", fake.processes)
    monkeypatch.setitem(sys.modules, "torch", fake.torch())
    return fake


def real_gpu_run() -> _runs.Run:
    claim = Claim(
        bytes=4 * 2**30, device="GPU-fake", name="t", mode="soft", index=0, id="i", record="r"
    )
    budget = Budget(
        bytes=4 * 2**30,
        device_uuid="GPU-fake",
        device_total=80 * 2**30,
        device_index=0,
        simulated=False,
        name="t",
    )
    return _runs.Run(claim, budget, "job", "label", "given", "cmd")


def test_nvml_is_asked_less_while_the_peak_is_flat(gpu: FakeGpu) -> None:
    run = real_gpu_run()
    for second in range(300):
        _runs._sample(run, float(second))
    # Doubling from 1 s to NVML_EVERY_MAX_S: 0, 1, 3, 7, 15, then every 15 s (was: 300 looks).
    assert gpu.looks <= 5 + 300 / _runs.NVML_EVERY_MAX_S
    assert run.peak == 900 * MiB and run.measure == "nvml+torch"


def test_a_new_torch_high_brings_the_next_look_forward(gpu: FakeGpu) -> None:
    run = real_gpu_run()
    for second in range(100):
        _runs._sample(run, float(second))
    looks = gpu.looks
    gpu.reserved = gpu.reserved_peak = 456 * MiB  # the allocator grew: so did the process
    gpu.nvml_used += 256 * MiB
    _runs._sample(run, 100.0)
    assert gpu.looks == looks + 1 and run.peak == 1156 * MiB
    _runs._sample(run, 101.0)  # still rising as far as anyone knows: a second later again
    assert gpu.looks == looks + 2
    _runs._sample(run, 102.0)  # flat at the last look: the wait doubles
    assert gpu.looks == looks + 2


def test_the_peak_between_looks_is_still_exact(gpu: FakeGpu) -> None:
    """A spike torch allocated and freed between two looks counts (its high-water mark); growth
    outside torch (CUDA context, libraries) shows at the next look, at most NVML_EVERY_MAX_S
    later, and the run's last sample always looks."""
    run = real_gpu_run()
    for second in range(60):
        _runs._sample(run, float(second))
    gpu.reserved_peak += 512 * MiB  # a spike, freed again: NVML never sees it
    _runs._sample(run, 60.0)
    assert run.peak == 900 * MiB + 512 * MiB
    for second in range(61, 120):  # flat again: the looks slow down
        _runs._sample(run, float(second))
    gpu.nvml_used += 32 * MiB  # a library loaded: outside the allocator
    for second in range(120, 121 + int(_runs.NVML_EVERY_MAX_S)):
        _runs._sample(run, float(second))
    assert run.peak == 900 * MiB + 512 * MiB + 32 * MiB
    gpu.nvml_used += 8 * MiB
    looks = gpu.looks
    _runs._sample(run)  # the last sample (finish): NVML now, whatever the pace
    assert gpu.looks == looks + 1 and run.peak == 900 * MiB + 512 * MiB + 40 * MiB
