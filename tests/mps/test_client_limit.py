"""The MPS server admits a limited number of clients per GPU; the ledger counts hard claims.

The admission loop is generic about modes: it is driven here with the mode claim() would pass on
a GPU with a reachable MPS daemon ("hard"), on a simulated device, with real records, real flocks
and, for crash safety, a real process killed with SIGKILL.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

import memgov
from memgov._gpu import enforce as _enforce, mpsctl as _mpsctl
from memgov._gpu.devices import candidates
from memgov._ledger import admission as _admission
from memgov._ledger.ledger import DeviceLedger
from memgov._ledger.records import Held
from tests.helpers import hard_holder

GIB = 2**30
HARD = ("hard", "MPS pinned device-memory limit (test)")


def admit(mode: tuple[str, str], wait: float | None = None) -> tuple[DeviceLedger, Held]:
    (device,) = candidates(None)
    admitted = _admission.admit(
        [DeviceLedger(device)],
        _admission.Request({device.uuid: GIB}, "job", wait, {device.uuid: mode}),
    )
    assert admitted.mode == mode[0]
    return admitted.ledger, admitted.held


@pytest.fixture
def limit_two(sim: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MEMGOV_MPS_CLIENTS", "2")
    return sim


def test_reason_is_a_function_of_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMGOV_MPS_CLIENTS", raising=False)
    assert _enforce.client_limit_reason(47, "hard", "GPU-x") is None
    assert _enforce.client_limit_reason(480, "soft", "GPU-x") is None  # soft claims use no slot
    reason = _enforce.client_limit_reason(48, "hard", "GPU-x")
    assert reason is not None and reason.startswith("MPS client limit 48 reached on GPU-x")


@pytest.mark.parametrize("bad", ["0", "-1", "many", "4.5"])
def test_bad_client_limit_is_refused_clearly(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("MEMGOV_MPS_CLIENTS", bad)
    with pytest.raises(memgov.MemgovError, match=r"MEMGOV_MPS_CLIENTS=.*accepted a whole number"):
        _mpsctl.client_limit()


def test_hard_claims_past_the_limit_are_refused_soft_ones_are_not(limit_two: str) -> None:
    held = [admit(HARD), admit(HARD)]
    snap = held[0][0].snapshot()
    assert snap.hard_clients == 2
    with pytest.raises(memgov.BudgetExceeded) as refused:
        admit(HARD)
    message = str(refused.value)
    assert "MPS client limit 2 reached on sim0 (2 hard-mode claims" in message
    assert "pass wait=SECONDS to queue for it" in message
    soft = admit(("soft", "no MPS daemon reachable"))  # memory fits; soft claims are no clients
    out = subprocess.run(
        [sys.executable, "-m", "memgov.cli", "status", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    modes = sorted(c["mode"] for c in json.loads(out.stdout)["devices"][0]["claims"])
    assert modes == ["hard", "hard", "soft"]
    for ledger, record in [*held, soft]:
        ledger.remove("claims", record)


def test_a_waiting_hard_claim_gets_the_slot_a_release_frees(limit_two: str) -> None:
    held = [admit(HARD), admit(HARD)]
    result: dict[str, Any] = {}

    def waiter() -> None:
        try:
            result["admitted"] = admit(HARD, wait=30)
        except Exception as exc:  # reported through result; the assertion below shows it
            result["error"] = exc

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not result, result  # queued behind the client limit
    ledger, record = held.pop()
    ledger.remove("claims", record)
    thread.join(20)
    assert "admitted" in result, result
    for ledger, record in [*held, result["admitted"]]:
        ledger.remove("claims", record)


def test_a_killed_hard_holder_frees_its_client_slot(
    sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_MPS_CLIENTS", "1")
    child = hard_holder.start()
    try:
        with pytest.raises(memgov.BudgetExceeded, match="MPS client limit 1 reached"):
            admit(HARD)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        ledger, record = admit(HARD)  # the dead holder's flock is gone, and so is its slot
        ledger.remove("claims", record)
    finally:
        child.kill()
        child.wait()
