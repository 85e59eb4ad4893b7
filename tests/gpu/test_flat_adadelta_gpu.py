"""On a GPU: the torch trainer's fused (Triton) Adadelta takes torch.optim.Adadelta's steps.

The CPU tests check the flat optimizer's torch operations; its one-kernel update runs only on a
GPU. Run by ``bash benchmarks/gpu/verify.sh gpu``; skipped anywhere else.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MNIST = Path(__file__).resolve().parents[2] / "experiments" / "mnist"


def test_fused_update_matches_torch_adadelta(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same gradients (random, 20 steps) into both optimizers: the parameters agree to the
    last bits a fused multiply-add may round differently. (Training two models side by side would
    compare cuDNN's run-to-run rounding too, which grows step by step.)"""
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(MNIST))
    sys.modules.pop("flat_adadelta", None)
    import flat_adadelta

    torch.manual_seed(5)
    model = (
        torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(32 * 26 * 26, 10),
        )
        .cuda()
        .to(memory_format=torch.channels_last)
    )
    twin = copy.deepcopy(model)
    mine, theirs = list(model.parameters()), list(twin.parameters())
    flat = flat_adadelta.FlatAdadelta(torch, mine, lr=1.0, rho=0.95, eps=1e-7)
    assert flat.kernel == "triton"
    ref = torch.optim.Adadelta(theirs, lr=1.0, rho=0.95, eps=1e-7)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(20):
        for a, b in zip(mine, theirs, strict=True):
            g = torch.randn(a.shape, device="cuda", generator=gen).contiguous(
                memory_format=torch.channels_last if a.dim() == 4 else torch.contiguous_format
            )
            a.grad, b.grad = g, g.clone()
        flat.step()
        ref.step()
    for a, b in zip(mine, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
        assert not torch.equal(a, b.detach() * 0)


@pytest.mark.parametrize("flags", [[], ["--cuda-graph"], ["--no-channels-last"]])
def test_the_trainer_learns_with_the_fused_update(flags: list[str]) -> None:
    """The trainer with its defaults (and replayed as a CUDA graph, and in NCHW) reports the
    fused update in its start event and learns: the second epoch's loss is below the first's."""
    import json
    import subprocess

    cmd = [
        sys.executable,
        "train_torch.py",
        "--device",
        "gpu",
        "--epochs",
        "2",
        "--limit",
        "6400",
        "--eval-limit",
        "1000",
        *flags,
    ]
    done = subprocess.run(cmd, cwd=MNIST, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines()]
    start = next(e for e in events if e["event"] == "start")
    assert start["prepared"] == {"optimizer": "FlatAdadelta", "update": "triton"}
    losses = [e["loss"] for e in events if e["event"] == "epoch"]
    assert len(losses) == 2 and losses[1] < losses[0], losses
    final = next(e for e in events if e["event"] == "done")
    assert final["test_acc"] > 0.9, final
