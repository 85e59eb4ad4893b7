"""Keras-example MNIST CNN in PyTorch. Run ``python train_torch.py --help``; reports on stdout.

Framework-only on purpose: memgov governs this process from outside (env vars, import hook),
so nothing here imports memgov or sets thread counts.
"""

from __future__ import annotations

import argparse
from typing import Any

import harness
import numpy as np
import report
from flat_adadelta import FlatAdadelta


class TorchTrainer:
    channels_last = False  # host batches as NCHW, the shape torch's convolutions take

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from torch import nn

        self.torch = torch
        if args.device == "gpu" and not torch.cuda.is_available():
            raise report.UsageError("--device gpu: torch sees no GPU")
        use_gpu = args.device != "cpu" and torch.cuda.is_available()
        self.dev = (
            torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
        )
        self.device = str(self.dev)
        torch.manual_seed(args.seed)

        self.model = nn.Sequential(
            nn.Conv2d(1, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            # Keras flattens channels-last maps in (height, width, channel) order; on a
            # channels-last tensor that order is a view, where torch's own Flatten copies it
            # (one kernel forward, one backward, per step).
            _flatten_hwc(nn) if args.channels_last else nn.Flatten(),
            nn.Linear(64 * 12 * 12, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, 10),
        )
        # Keras initialisation (Glorot-uniform weights, zero biases) so the three frameworks
        # train the same model, not three variants of it.
        for m in self.model:
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:  # always set here; the check is for the type checker
                    nn.init.zeros_(m.bias)
        self.model.to(self.dev)
        if args.channels_last:
            # Host batches need no conversion: with one channel, NCHW and NHWC are the same bytes.
            self.model.to(memory_format=torch.channels_last)
        if args.tf32:
            torch.set_float32_matmul_precision("high")
        self.upload = _Uploader(torch, self.dev)
        self.graphed = bool(getattr(args, "cuda_graph", False)) and self.dev.type == "cuda"
        # Keras' Adadelta defaults (torch's are rho=0.9, eps=1e-6).
        params = list(self.model.parameters())
        self.opt: Any
        if args.flat_optimizer and FlatAdadelta.fits(torch, params):
            self.opt = FlatAdadelta(torch, params, lr=1.0, rho=0.95, eps=1e-7)
        else:
            # Capturable: its step state stays on the device, as graph capture needs.
            self.opt = torch.optim.Adadelta(
                params, lr=1.0, rho=0.95, eps=1e-7, capturable=self.graphed
            )
        self.optimizer = type(self.opt).__name__
        self.loss_fn = nn.CrossEntropyLoss()
        self.graph: _StepGraph | None = None

    def prepare(self, train_samples: int, batch: int) -> dict[str, Any]:
        """Nothing to compile ahead; the start report says which optimizer runs."""
        return {"optimizer": self.optimizer, "update": getattr(self.opt, "kernel", "torch")}

    def train_epoch(self, batches: harness.Batches) -> tuple[float, float]:
        torch = self.torch
        self.model.train()
        if self.graphed:
            return self._train_epoch_graphed(batches)
        # Loss and logits are kept, not summed per step: each step then adds no GPU work for
        # the metrics, and nothing syncs the GPU before the epoch ends (a per-step .item()
        # would). What is kept: a scalar and a batch x 10 block per step, ~3 MB per epoch.
        losses, logits_kept, labels, sizes = [], [], [], []
        for xb, yb in batches:
            x, y = self.upload(xb), self.upload(yb)
            logits = self.model(x)
            loss = self.loss_fn(logits, y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            losses.append(loss.detach())
            logits_kept.append(logits.detach())
            labels.append(y)
            sizes.append(len(yb))
        if not sizes:
            return float("nan"), float("nan")
        n = sum(sizes)
        weights = torch.tensor(sizes, dtype=torch.float32)
        loss_sum = float((torch.stack(losses).float().cpu() * weights).sum())
        correct = int((torch.cat(logits_kept).argmax(1) == torch.cat(labels)).sum())
        return loss_sum / n, correct / n

    def _train_epoch_graphed(self, batches: harness.Batches) -> tuple[float, float]:
        n = 0
        for xb, yb in batches:
            if self.graph is None:
                self.graph = _StepGraph(self, self.upload(xb), self.upload(yb))
            if len(yb) != self.graph.batch:
                continue  # a graph replays fixed shapes: the final partial batch is skipped
            self.graph.step(self.upload(xb), self.upload(yb))
            n += len(yb)
        assert self.graph is not None
        return self.graph.take_sums(n)

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.model.eval()
        with self.torch.no_grad():
            return self.model(self.torch.from_numpy(x).to(self.dev)).argmax(1).cpu().numpy()

    def hog(self, mib: int) -> object:
        return self.torch.ones(mib << 20, dtype=self.torch.uint8, device=self.dev)

    def peak_allocator_mib(self) -> float | None:
        if self.dev.type != "cuda":
            return None
        return round(self.torch.cuda.max_memory_reserved(self.dev) / 2**20, 1)


def _flatten_hwc(nn: Any) -> Any:
    class FlattenHWC(nn.Module):  # type: ignore[misc,name-defined]
        def forward(self, x: Any) -> Any:
            return x.permute(0, 2, 3, 1).flatten(1)

    return FlattenHWC()


class _StepGraph:
    """One training step (forward, loss, backward, optimizer, metric sums) as a CUDA graph.

    Replaying it costs one launch instead of about 67 (measured on an H200), which is what many
    jobs packed on one GPU are short of: CPU. Warm-up runs three eager steps on the first batch
    on a side stream, as graph capture requires.
    """

    def __init__(self, trainer: TorchTrainer, x: Any, y: Any) -> None:
        torch = trainer.torch
        self.trainer = trainer
        self.batch = int(y.shape[0])
        self.x, self.y = x.clone(), y.clone()
        self.loss_sum = torch.zeros((), device=trainer.dev)
        self.correct = torch.zeros((), device=trainer.dev, dtype=torch.int64)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                trainer.opt.zero_grad(set_to_none=True)
                self._step_body()
        torch.cuda.current_stream().wait_stream(side)
        self.loss_sum.zero_()
        self.correct.zero_()
        # Grads start as None, so the captured backward writes them instead of adding to them:
        # each replay starts clean without a zero_grad (torch's whole-network capture recipe).
        trainer.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step_body()

    def _step_body(self) -> None:
        t = self.trainer
        logits = t.model(self.x)
        loss = t.loss_fn(logits, self.y)
        loss.backward()
        t.opt.step()
        self.loss_sum += loss.detach() * self.batch
        self.correct += (logits.argmax(1) == self.y).sum()

    def step(self, x: Any, y: Any) -> None:
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        self.graph.replay()

    def take_sums(self, n: int) -> tuple[float, float]:
        loss, correct = self.loss_sum.item(), self.correct.item()
        self.loss_sum.zero_()
        self.correct.zero_()
        return loss / max(n, 1), correct / max(n, 1)


class _Uploader:
    """Host batches to the device without a stream sync per step.

    A ``.to(device)`` from pageable memory synchronises the stream before it copies, so the CPU
    waits for the GPU on every batch; with many jobs sharing one GPU that wait dominates. Copies
    from pinned buffers are asynchronous; a small ring of them, each reused only after its copy's
    event has fired, lets the CPU run a few steps ahead.
    """

    SLOTS = 8

    def __init__(self, torch: Any, dev: Any) -> None:
        self.torch = torch
        self.dev = dev
        self.cuda = dev.type == "cuda"
        self.slots: list[tuple[Any, Any] | None] = [None] * (2 * self.SLOTS)  # x and y alternate
        self.turn = 0

    def __call__(self, array: np.ndarray) -> Any:
        if not self.cuda:
            return self.torch.from_numpy(array)
        index = self.turn % len(self.slots)
        self.turn += 1
        slot = self.slots[index]
        if slot is None:
            # Reused (one per batch costs CPU). Blocking: waiting on it sleeps; the default spins
            # a core, and 25 packed jobs spinning left no CPU for the work (all cores 100 % busy).
            buffer, done = None, self.torch.cuda.Event(blocking=True)
        else:
            buffer, done = slot
            done.synchronize()  # the copy out of this buffer has finished
        if buffer is None or tuple(buffer.shape) != array.shape:
            buffer = self.torch.from_numpy(array).pin_memory()
        else:
            buffer.numpy()[...] = array
        moved = buffer.to(self.dev, non_blocking=True)
        done.record()
        self.slots[index] = (buffer, done)
        return moved


if __name__ == "__main__":
    harness.main("torch", TorchTrainer)
