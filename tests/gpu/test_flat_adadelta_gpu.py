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
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(MNIST))
    sys.modules.pop("flat_adadelta", None)
    import flat_adadelta

    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(32 * 26 * 26, 10),
    ).cuda().to(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    flat = flat_adadelta.FlatAdadelta(torch, list(model.parameters()), lr=1.0, rho=0.95, eps=1e-7)
    assert flat.kernel == "triton"
    ref = torch.optim.Adadelta(twin.parameters(), lr=1.0, rho=0.95, eps=1e-7)
    for step in range(20):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(32, 1, 28, 28, generator=gen).cuda()
        y = torch.randint(0, 10, (32,), generator=gen).cuda()
        for net, opt in ((model, flat), (twin, ref)):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-6), (mine - theirs).abs().max()
