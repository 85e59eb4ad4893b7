"""claim(): arguments, budgets, device choice, and every setting it reads from the environment."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import memgov
from memgov._claim import HOLDER_ENV
from memgov._ledger.ledger import DeviceLedger, record_payload
from memgov._ledger.records import Held
from tests.helpers.procs import ledger

UID = os.getuid()
"""This user's uid: records the tests write are this user's (root in CI, anyone else too)."""

GIB = 2**30
pytestmark = pytest.mark.usefixtures("sim")


@pytest.fixture
def planted() -> Iterator[list[tuple[DeviceLedger, Held]]]:
    """Live claims of other holders, written through the ledger (this process keeps their locks)."""
    held: list[tuple[DeviceLedger, Held]] = []
    yield held
    for book, record in held:
        book.remove("claims", record)


def plant(
    planted: list[tuple[DeviceLedger, Held]], size: int, uuid: str = "sim0", name: str = "other"
) -> None:
    book = ledger(uuid)
    held = book.add("claims", record_payload("claim", book.device, size, name, "soft"))
    planted.append((book, held))


def test_claim_holds_until_released(private_ledger: Path) -> None:
    claim = memgov.claim("4GiB", name="trainer")
    assert (claim.bytes, claim.device, claim.name) == (4 * GIB, "sim0", "trainer")
    assert claim.index is None  # simulated: no cuda:N
    assert memgov.current() is claim and not claim.released
    assert os.environ[HOLDER_ENV] == f"sim0/{claim.record}"
    assert (private_ledger / "v1" / "sim0" / "claims" / claim.record).exists()
    assert str(claim) == "claim 'trainer': 4.00 GiB on sim0 (simulated, soft)"
    snap = ledger().snapshot()
    assert [(c.name, c.bytes, c.pid) for c in snap.claims] == [("trainer", 4 * GIB, os.getpid())]
    assert snap.free == 60 * GIB
    claim.release()
    claim.release()  # idempotent
    assert claim.released and memgov.current() is None and HOLDER_ENV not in os.environ
    assert ledger().snapshot().claims == []
    assert "released" in str(claim)


def test_claim_alive_answers_for_the_ledger(private_ledger: Path) -> None:
    # What auto-enable asks about MEMGOV_HOLDER; the ledger reads its own files.
    from memgov._ledger.ledger import claim_alive

    claim = memgov.claim("1GiB")
    assert claim_alive("sim0", claim.record)
    for uuid, record in [
        ("sim0", "../claims/" + claim.record),
        ("sim0", ".tmp-x.json"),
        ("sim0", "x.json"),
        ("sim1", claim.record),
        ("sim0", ""),
    ]:
        assert not claim_alive(uuid, record), (uuid, record)
    claim.release()
    assert not claim_alive("sim0", claim.record)


def test_context_manager_and_default_name() -> None:
    with memgov.claim(GIB) as claim:
        assert claim.name.endswith(f":{os.getpid()}")
    assert claim.released and ledger().snapshot().claims == []


def test_one_claim_per_process() -> None:
    with memgov.claim("1GiB"):
        with pytest.raises(memgov.MemgovError, match=r"already holds claim .* release it before"):
            memgov.claim("1GiB")
        with pytest.raises(memgov.MemgovError, match="already holds"):
            memgov.claim("1GiB", wait=5)  # a holder that waits could deadlock: refused at once
    with memgov.claim("1GiB"):
        pass


@pytest.mark.parametrize(
    ("size", "expected"), [("25%", 16 * GIB), ("100%", 64 * GIB), ("0.5%", int(64 * GIB * 0.005))]
)
def test_percentages_are_of_the_device(size: str, expected: int) -> None:
    with memgov.claim(size) as claim:
        assert claim.bytes == expected


@pytest.mark.parametrize("size", ["65GiB", "101%", 65 * GIB, "0", "lots", 0])
def test_sizes_a_device_can_never_hold_are_value_errors(size: object) -> None:
    with pytest.raises(ValueError, match="claim size") as info:
        memgov.claim(size)  # type: ignore[arg-type]
    assert not isinstance(info.value, memgov.BudgetExceeded)
    assert memgov.current() is None and ledger().snapshot().claims == []


def test_budget_exceeded_says_why(planted: list[tuple[DeviceLedger, Held]]) -> None:
    plant(planted, 40 * GIB, name="big job")
    plant(planted, 20 * GIB, name="small job")
    with pytest.raises(memgov.BudgetExceeded) as info:
        memgov.claim("8GiB")
    exc = info.value
    assert (exc.device, exc.requested, exc.free, exc.queued_ahead) == ("sim0", 8 * GIB, 4 * GIB, 0)
    assert exc.holders == [("big job", 40 * GIB), ("small job", 20 * GIB)]
    message = str(exc)
    assert "cannot claim 8.00 GiB on sim0" in message
    assert "free budget 4.00 GiB of 64.00 GiB" in message
    holders = f"big job 40.00 GiB (uid {UID}), small job 20.00 GiB (uid {UID})"
    assert f"largest holders: {holders}" in message
    assert "pass wait=SECONDS to queue for it (MEMGOV_WAIT=SECONDS, memgov run --wait)" in message
    with memgov.claim("4GiB"):  # exactly what is free still fits
        pass


def test_waiting_runs_out_and_leaves_no_ticket(planted: list[tuple[DeviceLedger, Held]]) -> None:
    plant(planted, 62 * GIB)
    with pytest.raises(memgov.BudgetExceeded, match=r"waited 0\.2 s"):
        memgov.claim("4GiB", wait=0.2)
    assert ledger().snapshot().queue == []


def test_simulated_used_memory_is_outside_every_budget(
    planted: list[tuple[DeviceLedger, Held]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB:4GiB")
    plant(planted, 12 * GIB)
    snap = ledger().snapshot()
    assert (snap.claimed, snap.outside, snap.free) == (12 * GIB, 4 * GIB, 0)
    with pytest.raises(memgov.BudgetExceeded, match=r"4\.00 GiB used outside memgov"):
        memgov.claim("1GiB")


def test_reserve_shrinks_capacity_and_an_impossible_request_does_not_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMGOV_RESERVE", "8GiB")
    assert ledger().snapshot().capacity == 56 * GIB
    with pytest.raises(memgov.BudgetExceeded, match="it can never fit") as info:
        memgov.claim("60GiB", wait=600)  # returns at once: no release can ever make room
    assert "8.00 GiB reserve" in str(info.value)
    with memgov.claim("56GiB"):
        pass


@pytest.mark.parametrize(
    ("raw", "reserve"), [("0", 0), ("12.5%", 8 * GIB), ("1GiB", GIB), (" 2G ", 2 * GIB), ("", 0)]
)
def test_reserve_values(raw: str, reserve: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_RESERVE", raw)
    assert ledger().snapshot().reserve == reserve


@pytest.mark.parametrize("raw", ["lots", "-1G", "150%", "1.5", "65GiB", "0x10", "1e9", "%"])
def test_garbage_reserve_is_a_config_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_RESERVE", raw)
    with pytest.raises(memgov.ConfigError, match="MEMGOV_RESERVE"):
        memgov.claim("1GiB")
    assert memgov.current() is None


@pytest.mark.parametrize("raw", ["relative/dir", "./memgov", "~/memgov", "memgov"])
def test_relative_memgov_dir_is_a_config_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGOV_DIR", raw)
    with pytest.raises(memgov.ConfigError, match="must be an absolute path"):
        memgov.claim("1GiB")


@pytest.mark.parametrize("raw", ["0", "two", "-1", "1.5", "4 threads"])
def test_garbage_threads_is_refused_before_anything_is_held(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGOV_THREADS", raw)
    with pytest.raises(memgov.ConfigError, match="MEMGOV_THREADS"):
        memgov.claim("1GiB")
    assert memgov.current() is None and ledger().snapshot().claims == []


@pytest.mark.parametrize("wait", [-1, "5", math.nan, math.inf, True, [1]])
def test_bad_wait_values(wait: object) -> None:
    with pytest.raises(memgov.ConfigError, match=r"^wait=.*: accepted seconds >= 0 to queue"):
        memgov.claim("1GiB", wait=wait)  # type: ignore[arg-type]


def test_wait_zero_fails_at_once(planted: list[tuple[DeviceLedger, Held]]) -> None:
    plant(planted, 64 * GIB)
    with pytest.raises(memgov.BudgetExceeded, match="pass wait=SECONDS"):
        memgov.claim("1GiB", wait=0)


@pytest.mark.parametrize("name", ["", "   ", "x" * 129, "a\nb", 5])
def test_bad_names(name: object) -> None:
    with pytest.raises(ValueError, match="accepted a printable string of 1 to 128 characters"):
        memgov.claim("1GiB", name=name)  # type: ignore[arg-type]


@pytest.fixture
def three(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # free budgets: sim0 16 GiB, sim1 64 - 40 = 24 GiB, sim2 32 GiB
    monkeypatch.setenv("MEMGOV_DEVICES", "sim0:16GiB,sim1:64GiB:40GiB,sim2:32GiB")


@pytest.mark.usefixtures("three")
def test_auto_picks_the_device_with_most_free_budget(
    planted: list[tuple[DeviceLedger, Held]],
) -> None:
    with memgov.claim("1GiB", device="auto") as claim:
        assert claim.device == "sim2"
    plant(planted, 20 * GIB, uuid="sim2")  # sim2 now has 12 GiB free, sim1 24 GiB
    with memgov.claim("1GiB", device="auto") as claim:
        assert claim.device == "sim1"
    plant(planted, 23 * GIB, uuid="sim1")  # free: sim0 16, sim1 1, sim2 12
    with memgov.claim("10%", device="auto") as claim:
        assert (claim.device, claim.bytes) == ("sim0", int(16 * GIB * 0.1))


@pytest.mark.usefixtures("three")
def test_auto_refusal_describes_the_roomiest_device(
    planted: list[tuple[DeviceLedger, Held]],
) -> None:
    plant(planted, 20 * GIB, uuid="sim2")  # free: sim0 16, sim1 24, sim2 12
    with pytest.raises(memgov.BudgetExceeded) as info:
        memgov.claim("30GiB", device="auto")
    assert (info.value.device, info.value.free) == ("sim1", 24 * GIB)
    assert "can never fit" not in str(info.value)


@pytest.mark.usefixtures("three")
def test_auto_skips_devices_too_small_for_the_request() -> None:
    # 33 GiB is larger than sim0 (16) and sim2 (32): only sim1 (64, 40 used outside) can hold it.
    with pytest.raises(memgov.BudgetExceeded, match=r"waited 0\.1 s") as info:
        memgov.claim("33GiB", device="auto", wait=0.1)
    assert info.value.device == "sim1"
    with pytest.raises(ValueError, match=r"larger than the largest device, sim1 \(64\.00 GiB\)"):
        memgov.claim("65GiB", device="auto")  # no device is that large
    with pytest.raises(ValueError, match="cannot read 'lots' as a size"):
        memgov.claim("lots", device="auto")


@pytest.mark.usefixtures("three")
def test_device_by_index_and_uuid() -> None:
    with memgov.claim("1GiB", device=1) as claim:
        assert claim.device == "sim1"
    with memgov.claim("1GiB", device="sim2") as claim:
        assert claim.device == "sim2"
    with pytest.raises(memgov.NoDeviceError, match=r"indices 0\.\.2"):
        memgov.claim("1GiB", device=3)


@pytest.mark.parametrize("where", ["_settle", "govern"])
def test_a_claim_that_fails_after_admission_holds_nothing(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memgov import _adapters, _claim

    def broken(*_args: object) -> None:
        raise RuntimeError("adapter broke")

    target = (_claim, "_settle") if where == "_settle" else (_adapters, "govern")
    with monkeypatch.context() as patch:
        patch.setattr(*target, broken)
        patch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        with pytest.raises(RuntimeError, match="adapter broke"):
            memgov.claim("4GiB")
        assert memgov.current() is None and HOLDER_ENV not in os.environ
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert ledger().snapshot().claims == []
    with memgov.claim("64GiB"):  # the whole budget is free again, in this same process
        pass


def test_a_release_gives_the_budget_back_before_it_folds_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Folding the run into its profile is this process's bookkeeping (a last sample, a durable
    # write that waits for the disk): a claim queued behind this one must not wait for it.
    from memgov._profiles import store as _profiles

    real, claims_then = _profiles.record, []

    def record(*args: object, **kwargs: object) -> object:
        claims_then.append(os.listdir(ledger().path / "claims"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_profiles, "record", record)
    with memgov.claim("1GiB"):
        assert len(os.listdir(ledger().path / "claims")) == 1
    assert claims_then == [[]]  # [[its record]] when folded first


def test_an_interrupt_while_a_queued_claim_hands_over_leaves_nothing_held(
    private_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admitted from the queue, a waiter shares what it judged (its store of dead names) before
    its ticket goes: Ctrl-C landing there leaves neither its claim nor its ticket behind."""
    from memgov._ledger import deadnames as _deadnames

    real = _deadnames.flush

    def interrupted() -> None:
        if sys._getframe(1).f_code.co_filename.endswith("_ledger/admission.py"):  # not a look's
            raise KeyboardInterrupt
        real()

    monkeypatch.setattr(_deadnames, "flush", interrupted)
    with pytest.raises(KeyboardInterrupt):
        memgov.claim("1GiB", wait=5)  # room at once, through the queue
    monkeypatch.setattr(_deadnames, "flush", real)
    folder = private_ledger / "v1" / "sim0"
    # Removed, not only unlocked: no scan has run since (a dead file would wait for one).
    assert os.listdir(folder / "claims") == [] and os.listdir(folder / "queue") == []
    snap = ledger().snapshot()
    assert snap.claims == [] and snap.queue == []
