"""torch's Adadelta, step for step, over one flat buffer per state instead of one tensor per layer.

torch's Adadelta (foreach, the default on a GPU) runs its element-wise steps as eleven
multi-tensor kernels that give one thread block per 65,536 elements: for this model's 1.2 M
parameters about 19 blocks per kernel, which leaves the GPU's 132 SMs nearly empty and took 134 us
of the 369 us of kernel time per training step (torch.profiler, one job on an H200; docs/pack.md).
Here the parameters live in one contiguous buffer (each layer's weight a view into it, in its own
memory format) and the gradients are gathered into one buffer with a single copy. The update is
then one Triton kernel on a GPU (checked against the torch operations when the optimizer is
made), else torch's own operations, each one ordinary element-wise kernel over 1.2 M elements.
The arithmetic is torch's (torch/optim/adadelta.py, single-tensor path, no weight decay, no
maximize; the Triton kernel with IEEE square roots and divisions, which may round the last bit
differently where the compiler fuses a multiply-add), so the model trains the same.
"""

from __future__ import annotations

from typing import Any


class FlatAdadelta:
    def __init__(
        self, torch: Any, params: list[Any], lr: float, rho: float, eps: float, fused: bool = True
    ) -> None:
        self.torch = torch
        self.params = params
        self.lr, self.rho, self.eps = lr, rho, eps
        sizes = [p.numel() for p in params]
        self.spans = [(sum(sizes[:k]), n) for k, n in enumerate(sizes)]
        first = params[0]
        self.flat = torch.empty(sum(sizes), device=first.device, dtype=first.dtype)
        offset = 0
        for p, n in zip(params, sizes, strict=True):
            # The same strides as the layer's own tensor (channels-last weights stay
            # channels-last): its n elements are one contiguous run of the buffer.
            view = self.flat[offset : offset + n].as_strided(p.shape, p.stride())
            view.copy_(p.detach())
            # From here the layer's weight is this view: moving or re-typing the model after
            # (`.to()`, `.half()`, `load_state_dict(assign=True)`) would detach it from the
            # buffer the updates go to. The trainer makes the optimizer last.
            p.data = view
            offset += n
        self.square_avg = torch.zeros_like(self.flat)
        self.acc_delta = torch.zeros_like(self.flat)
        # On a GPU with Triton (it comes with torch's CUDA builds), the whole update is one
        # kernel instead of eleven: what packed jobs under MPS are short of is the GPU's rate of
        # kernels, not its arithmetic (docs/pack.md).
        self._fused, self.kernel = None, "torch"
        if fused and self.flat.is_cuda:
            self._fused, self.kernel = _checked(torch, _triton_step(), self.flat.device)

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
        if any(p.grad is None for p in self.params):
            # torch skips a parameter without a gradient (its state does not decay): each of
            # the others then takes its own update on its run of the buffers. Never the case
            # in the trainer, where every parameter has a gradient after each backward.
            for p, (at, n) in zip(self.params, self.spans, strict=True):
                if p.grad is not None:
                    part = slice(at, at + n)
                    _torch_step(
                        self.flat[part],
                        self._memory_order(p),
                        self.square_avg[part],
                        self.acc_delta[part],
                        self.lr,
                        self.rho,
                        self.eps,
                    )
            return
        # A gradient has its parameter's strides (autograd's layout contract), so its memory,
        # read in order, lines up with the parameter's run of the buffer.
        grad = self.torch.cat([self._memory_order(p) for p in self.params])
        update = self._fused or _torch_step
        update(self.flat, grad, self.square_avg, self.acc_delta, self.lr, self.rho, self.eps)

    def _memory_order(self, p: Any) -> Any:
        g = p.grad
        if g.stride() != p.stride():
            like = self.torch.empty_strided(p.shape, p.stride(), device=g.device, dtype=g.dtype)
            g = like.copy_(g)
        return g.as_strided((p.numel(),), (1,))


def _torch_step(flat: Any, grad: Any, sa: Any, ad: Any, lr: float, rho: float, eps: float) -> None:
    """torch/optim/adadelta.py's single-tensor update, operation for operation."""
    sa.mul_(rho).addcmul_(grad, grad, value=1 - rho)
    std = sa.add(eps).sqrt_()
    delta = ad.add(eps).sqrt_().div_(std).mul_(grad)
    ad.mul_(rho).addcmul_(delta, delta, value=1 - rho)
    flat.add_(delta, alpha=-lr)


def _checked(torch: Any, fused: Any, device: Any) -> tuple[Any, str]:
    """Try the fused kernel once against the torch operations on a small buffer: a kernel that
    does not compile or does not agree is not used (the job trains on, with the torch steps)."""
    if fused is None:
        return None, "torch (no Triton)"
    gen = torch.Generator(device="cpu").manual_seed(0)
    state = [torch.rand(5003, generator=gen).to(device) for _ in range(4)]
    twin = [t.clone() for t in state]
    try:
        for _ in range(3):
            fused(*state, 1.0, 0.95, 1e-7)
            _torch_step(*twin, 1.0, 0.95, 1e-7)
        pairs = zip(state, twin, strict=True)
        agree = all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in pairs)
    except Exception as exc:  # a compiler or driver problem: fall back, say why
        return None, f"torch (Triton failed: {type(exc).__name__})"
    return (fused, "triton") if agree else (None, "torch (Triton disagreed)")


def _triton_step() -> Any:
    """The update as one Triton kernel (IEEE square roots and divisions, like torch's), or None
    where Triton is missing or cannot compile (the torch operations then run instead)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit  # type: ignore[misc]
    def adadelta(p_ptr, g_ptr, sa_ptr, ad_ptr, n, lr, rho, rest, eps, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        g = tl.load(g_ptr + offsets, mask=inside)
        sa = tl.load(sa_ptr + offsets, mask=inside)
        ad = tl.load(ad_ptr + offsets, mask=inside)
        p = tl.load(p_ptr + offsets, mask=inside)
        sa = sa * rho + rest * g * g
        delta = tl.div_rn(tl.sqrt_rn(ad + eps), tl.sqrt_rn(sa + eps)) * g
        ad = ad * rho + rest * delta * delta
        tl.store(sa_ptr + offsets, sa, mask=inside)
        tl.store(ad_ptr + offsets, ad, mask=inside)
        tl.store(p_ptr + offsets, p - lr * delta, mask=inside)

    block = 1024

    def step(flat: Any, grad: Any, sa: Any, ad: Any, lr: float, rho: float, eps: float) -> None:
        n = flat.numel()
        # 1 - rho in double precision, as torch's value=1 - rho (0.05, not float32's
        # 0.050000012 that 1 - rho computed in the kernel gives).
        adadelta[(triton.cdiv(n, block),)](
            flat, grad, sa, ad, n, lr, rho, 1 - rho, eps, BLOCK=block
        )

    return step
