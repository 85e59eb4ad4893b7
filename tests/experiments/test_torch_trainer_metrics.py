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
    for name in ("harness", "mnist_data", "report", "train_torch"):
        sys.modules.pop(name, None)
    import harness
    import mnist_data
    import train_torch

    precision = torch.get_float32_matmul_precision()  # --tf32 sets it process-wide
    yield harness, mnist_data, train_torch
    torch.set_float32_matmul_precision(precision)
    for name in ("harness", "mnist_data", "report", "train_torch"):
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
