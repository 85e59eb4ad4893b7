"""torch's Adadelta, step for step, over one flat buffer per state instead of one tensor per layer.

torch's Adadelta (foreach, the default on a GPU) runs each of its ~10 element-wise steps as a
multi-tensor kernel that gives one thread block per 65,536 elements: for this model's 1.2 M
parameters about 19 blocks per kernel, which leaves the GPU's 132 SMs nearly empty and took 253 us
of the 629 us of GPU work per training step (torch.profiler, one job on an H200; docs/pack.md).
Here the parameters live in one contiguous buffer (each layer's weight a view into it, in its own
memory format), the gradients are gathered into one buffer with a single copy, and every step is
one ordinary element-wise kernel over 1.2 M elements. The arithmetic is torch's, operation for
operation (torch/optim/adadelta.py, single-tensor path, no weight decay, no maximize), so the
model trains the same.
"""

from __future__ import annotations

from typing import Any


class FlatAdadelta:
    def __init__(self, torch: Any, params: list[Any], lr: float, rho: float, eps: float) -> None:
        self.torch = torch
        self.params = params
        self.lr, self.rho, self.eps = lr, rho, eps
        sizes = [p.numel() for p in params]
        first = params[0]
        self.flat = torch.empty(sum(sizes), device=first.device, dtype=first.dtype)
        offset = 0
        for p, n in zip(params, sizes, strict=True):
            # The same strides as the layer's own tensor (channels-last weights stay
            # channels-last): its n elements are one contiguous run of the buffer.
            view = self.flat[offset : offset + n].as_strided(p.shape, p.stride())
            view.copy_(p.detach())
            p.data = view
            offset += n
        self.square_avg = torch.zeros_like(self.flat)
        self.acc_delta = torch.zeros_like(self.flat)

    @staticmethod
    def fits(torch: Any, params: list[Any]) -> bool:
        """Each parameter must be dense (contiguous in some memory format), one device and type."""
        if not params:
            return False
        kinds = {(p.device, p.dtype) for p in params}
        last = torch.channels_last
        dense = all(
            p.is_contiguous() or (p.dim() == 4 and p.is_contiguous(memory_format=last))
            for p in params
        )
        return len(kinds) == 1 and dense

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        torch = self.torch
        # A gradient has its parameter's strides (autograd's layout contract), so its memory,
        # read in order, lines up with the parameter's run of the buffer.
        grad = torch.cat([self._memory_order(p) for p in self.params])
        rho, eps = self.rho, self.eps
        self.square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = self.square_avg.add(eps).sqrt_()
        delta = self.acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
        self.acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        self.flat.add_(delta, alpha=-self.lr)

    def _memory_order(self, p: Any) -> Any:
        g = p.grad
        if g is None:
            return self.torch.zeros(p.numel(), device=p.device, dtype=p.dtype)
        if g.stride() != p.stride():
            like = self.torch.empty_strided(p.shape, p.stride(), device=g.device, dtype=g.dtype)
            g = like.copy_(g)
        return g.as_strided((p.numel(),), (1,))
