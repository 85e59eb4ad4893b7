"""The torch trainer's epoch loss and accuracy, summed once per epoch, equal a per-step sum.

The trainer keeps each step's loss and logits and reduces them at the epoch's end (no GPU work
per step for metrics); this replays the same training with the textbook per-step sums and
compares, a short last batch included.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
MNIST = Path(__file__).resolve().parents[2] / "experiments" / "mnist"


@pytest.fixture()
def trainer_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, object, object]]:
    monkeypatch.syspath_prepend(str(MNIST))
    for name in ("harness", "mnist_data", "report", "train_torch", "flat_adadelta"):
        sys.modules.pop(name, None)
    import harness
    import mnist_data
    import train_torch

    precision = torch.get_float32_matmul_precision()  # --tf32 sets it process-wide
    yield harness, mnist_data, train_torch
    torch.set_float32_matmul_precision(precision)
    for name in ("harness", "mnist_data", "report", "train_torch", "flat_adadelta"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("flags", [[], ["--no-channels-last", "--no-tf32"]])
def test_epoch_metrics_match_per_step_sums(trainer_modules: tuple, flags: list[str]) -> None:
    harness, mnist_data, train_torch = trainer_modules
    x, y, _, _ = mnist_data.load()
    x, y = x[:100], y[:100]  # batches of 32, 32, 32 and 4
    trainer = train_torch.TorchTrainer(harness.parse_args("torch", ["--device", "cpu", *flags]))
    model = copy.deepcopy(trainer.model)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()

    torch.manual_seed(7)
    loss, acc = trainer.train_epoch(mnist_data.batches(x, y, 32, np.random.default_rng(1), False))

    torch.manual_seed(7)  # the same dropout masks, the same batches
    model.train()
    loss_sum, correct, n = 0.0, 0, 0
    for xb, yb in mnist_data.batches(x, y, 32, np.random.default_rng(1), False):
        xt, yt = torch.from_numpy(xb), torch.from_numpy(yb)
        logits = model(xt)
        step_loss = loss_fn(logits, yt)
        opt.zero_grad(set_to_none=True)
        step_loss.backward()
        opt.step()
        loss_sum += step_loss.item() * len(yb)
        correct += int((logits.argmax(1) == yt).sum())
        n += len(yb)
    assert n == 100
    assert loss == pytest.approx(loss_sum / n, rel=1e-4)
    assert acc == correct / n


def test_flags_default_on_and_can_be_turned_off(trainer_modules: tuple) -> None:
    harness, _, _ = trainer_modules
    on = harness.parse_args("torch", [])
    off = harness.parse_args("torch", ["--no-channels-last", "--no-tf32"])
    assert (on.channels_last, on.tf32) == (True, True)
    assert (off.channels_last, off.tf32) == (False, False)


@pytest.mark.parametrize("channels_last", [False, True])
def test_flat_adadelta_is_torchs_adadelta(trainer_modules: tuple, channels_last: bool) -> None:
    """The flat optimizer takes the same steps as torch.optim.Adadelta (parameters compared after
    five steps, channels-last weights included), and the layers' weights live in its buffer."""
    sys.modules.pop("flat_adadelta", None)
    import flat_adadelta

    torch.manual_seed(3)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)
    )
    if channels_last:
        model.to(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    params = list(model.parameters())
    assert flat_adadelta.FlatAdadelta.fits(torch, params)
    flat = flat_adadelta.FlatAdadelta(torch, params, lr=1.0, rho=0.95, eps=1e-7)
    ref = torch.optim.Adadelta(twin.parameters(), lr=1.0, rho=0.95, eps=1e-7)
    for p in params:
        assert p.untyped_storage().data_ptr() == flat.flat.untyped_storage().data_ptr()
    if channels_last:
        assert params[0].is_contiguous(memory_format=torch.channels_last)
    for step in range(5):
        x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(step))
        y = torch.tensor([0, 1, 2, 0, 1, 2])
        for net, opt in ((model, flat), (twin, ref)):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6)
        assert not torch.equal(mine, theirs.detach() * 0)  # trained, not zeroed


def test_flat_optimizer_is_the_default_and_can_be_turned_off(trainer_modules: tuple) -> None:
    harness, _, train_torch = trainer_modules
    on = train_torch.TorchTrainer(harness.parse_args("torch", ["--device", "cpu"]))
    off = train_torch.TorchTrainer(
        harness.parse_args("torch", ["--device", "cpu", "--no-flat-optimizer"])
    )
    assert on.prepare(100, 32) == {"optimizer": "FlatAdadelta", "update": "torch"}  # no GPU here
    assert off.prepare(100, 32) == {"optimizer": "Adadelta", "update": "torch"}


def test_a_parameter_without_a_gradient_is_skipped_like_torch(trainer_modules: tuple) -> None:
    """torch leaves a parameter without a gradient alone (its state does not decay); so does the
    flat optimizer, for a parameter that gets a gradient only every other step."""
    sys.modules.pop("flat_adadelta", None)
    import flat_adadelta

    torch.manual_seed(4)
    a, b = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3, 2))
    a2, b2 = (torch.nn.Parameter(t.detach().clone()) for t in (a, b))
    flat = flat_adadelta.FlatAdadelta(torch, [a, b], lr=1.0, rho=0.95, eps=1e-7)
    ref = torch.optim.Adadelta([a2, b2], lr=1.0, rho=0.95, eps=1e-7)
    for step in range(6):
        gen = torch.Generator().manual_seed(step)
        ga, gb = torch.randn(5, generator=gen), torch.randn(3, 2, generator=gen)
        a.grad, a2.grad = ga, ga.clone()
        b.grad, b2.grad = (gb, gb.clone()) if step % 2 == 0 else (None, None)
        flat.step()
        ref.step()
    assert torch.equal(a, a2) and torch.equal(b, b2)
