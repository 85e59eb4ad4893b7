"""Keras-example MNIST CNN in plain JAX. Run ``python train_jax.py --help``; reports on stdout.

No flax/optax: the model is four layers and Adadelta is four lines, and the trainer must run
where only jax is installed. Framework-only on purpose: memgov governs this process from outside
(env vars, import hook), so nothing here imports memgov or sets thread counts.
"""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any

import harness
import numpy as np
import report

RHO, EPS, LR = 0.95, 1e-7, 1.0  # Keras' Adadelta defaults, lr as in the Keras example
# Batches per upload. Handing each batch to the jitted step as a numpy array copies it to the
# device synchronously, so host and GPU never overlap: on an H200 the per-step loop ran 42,141
# samples/s and the same step on batches already on the device 82,189
# (benchmarks/gpu/jax_trainer_probe.py, results/HISTORY.md). So CHUNK host batches (shuffled per
# epoch, uint8) go to the device in one upload, and each step picks its batch there by an index
# that lives on the device too: every step is one asynchronous dispatch, with no transfer and no
# padding computed. (A lax.scan over the chunk, tried first, ran 6x slower per step than the
# plain jitted step on XLA:CPU, and its padded steps were computed.)
CHUNK = 64


_CACHE_EVENTS = {
    "/jax/compilation_cache/cache_hits": "cache_hits",
    "/jax/compilation_cache/cache_misses": "cache_misses",
}
_cache_counts = {"cache_hits": 0, "cache_misses": 0}


def _count_cache_event(event: str, **_kwargs: Any) -> None:
    name = _CACHE_EVENTS.get(event)
    if name is not None:
        _cache_counts[name] += 1


class JaxTrainer:
    channels_last = True
    raw_images = True  # uint8 batches, scaled on the device (a quarter of the bytes to copy)

    def __init__(self, args: argparse.Namespace) -> None:
        if args.device == "cpu":
            # Read when the backend initialises, so it must be set before jax is imported.
            os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        # Persistent-cache hits and misses (a packer's shared cache), for the start report.
        jax.monitoring.register_event_listener(_count_cache_event)
        if args.device == "gpu":
            try:
                self.dev = jax.devices("gpu")[0]
            except RuntimeError as exc:
                raise report.UsageError(f"--device gpu: jax sees no GPU ({exc})") from exc
        else:
            self.dev = jax.devices()[0]
        self.device = "cpu" if self.dev.platform == "cpu" else f"cuda:{self.dev.id}"

        key = jax.random.PRNGKey(args.seed)
        key, init_key = jax.random.split(key)
        self.params = jax.device_put(_init_params(jax, init_key), self.dev)
        zeros = functools.partial(jax.tree_util.tree_map, jnp.zeros_like)
        self.opt_state = (zeros(self.params), zeros(self.params))  # E[g^2], E[dx^2]
        self.key = jax.device_put(key, self.dev)
        self.batch: int | None = None
        self._step: Any = jax.jit(functools.partial(_train_step, jax), donate_argnums=(0, 1, 2, 3))
        self._indexed: Any = jax.jit(
            functools.partial(_train_indexed, jax), donate_argnums=(0, 1, 2, 3)
        )
        self._predict: Any = jax.jit(lambda p, x: jnp.argmax(_forward(jax, p, x, None), axis=-1))

    def prepare(self, train_samples: int, batch: int) -> dict[str, Any]:
        """Compile, before the start report, the programs an epoch and the evaluation run (the
        step on an uploaded chunk, the step for a short last batch, the prediction on one padded
        batch), so epoch 1 is training only and a packer's persistent compilation cache holds
        them once this job has reported "start". Returns the seconds and cache hits/misses."""
        import time

        jnp = self.jnp
        t0 = time.perf_counter()
        short = train_samples % batch
        self.batch = batch
        sums = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
        state = (self.params, self.opt_state, self.key, sums)
        image = (28, 28, 1)
        xs = np.zeros((CHUNK, batch, *image), np.uint8)
        ys = np.zeros((CHUNK, batch), np.int32)
        # AOT: lower + compile; the compiled programs replace the jitted functions (same
        # donation), so nothing compiles again during the run.
        self._indexed = self._indexed.lower(*state, np.int32(0), xs, ys).compile()
        if short:
            x1, y1 = np.zeros((short, *image), np.uint8), np.zeros(short, np.int32)
            self._step = self._step.lower(*state, x1, y1).compile()
        self._predict = self._predict.lower(
            self.params, np.zeros((batch, *image), np.uint8)
        ).compile()
        return {"compile_s": round(time.perf_counter() - t0, 3), **_cache_counts}

    def train_epoch(self, batches: harness.Batches) -> tuple[float, float]:
        jnp = self.jnp
        state = (self.params, self.opt_state, self.key)
        sums = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))  # loss*n, correct
        n = 0
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        for xb, yb in batches:
            n += len(yb)
            if pending and len(yb) != len(pending[0][1]):  # a short last batch: on its own
                state, sums = self._run_chunk(state, sums, pending)
                pending = []
                state, sums = self._one_step(state, sums, xb, yb)
                continue
            pending.append((xb, yb))
            if len(pending) == CHUNK:
                state, sums = self._run_chunk(state, sums, pending)
                pending = []
        if pending:
            state, sums = self._run_chunk(state, sums, pending)
        self.params, self.opt_state, self.key = state
        # float() waits for the device, so the epoch time includes all queued steps.
        return float(sums[0]) / n, int(sums[1]) / n

    def _one_step(self, state: Any, sums: Any, xb: np.ndarray, yb: np.ndarray) -> Any:
        *new_state, sums = self._step(*state, sums, xb, yb.astype(np.int32))
        return tuple(new_state), sums

    def _run_chunk(self, state: Any, sums: Any, pending: list) -> Any:
        """Upload up to CHUNK equal-sized batches at once, then one step per batch, each taking
        its batch on the device by a device-side index (no transfer, no wait, nothing padded is
        computed: the upload buffer alone is padded to CHUNK, so the step compiles once)."""
        jax = self.jax
        xs = np.zeros((CHUNK, *pending[0][0].shape), pending[0][0].dtype)
        ys = np.zeros((CHUNK, len(pending[0][1])), np.int32)
        for i, (xb, yb) in enumerate(pending):  # one copy into the upload buffer, no stack
            xs[i], ys[i] = xb, yb
        xs_dev, ys_dev = jax.device_put((xs, ys), self.dev)
        index = jax.device_put(np.int32(0), self.dev)
        for _ in pending:
            *state, sums, index = self._indexed(*state, sums, index, xs_dev, ys_dev)
        return tuple(state), sums

    def predict(self, x: np.ndarray) -> np.ndarray:
        n = len(x)
        if self.batch is not None and n < self.batch:  # one compiled shape: pad the last batch
            x = np.concatenate([x, np.zeros((self.batch - n, *x.shape[1:]), x.dtype)])
        return np.asarray(self._predict(self.params, x))[:n]

    def hog(self, mib: int) -> object:
        held = self.jnp.ones((mib << 20,), dtype=self.jnp.uint8, device=self.dev)
        # Dispatch is asynchronous; make the allocation (and any OOM) happen now.
        return held.block_until_ready()

    def peak_allocator_mib(self) -> float | None:
        if self.dev.platform == "cpu":
            return None
        stats = self.dev.memory_stats() or {}
        peak = stats.get("peak_bytes_in_use")
        return None if peak is None else round(peak / 2**20, 1)


def _init_params(jax: Any, key: Any) -> dict[str, Any]:
    """Keras initialisation: Glorot-uniform kernels, zero biases."""
    shapes = {  # conv kernels HWIO, dense kernels (in, out)
        "conv1": (3, 3, 1, 32),
        "conv2": (3, 3, 32, 64),
        "dense1": (12 * 12 * 64, 128),
        "dense2": (128, 10),
    }
    params = {}
    for (name, shape), k in zip(shapes.items(), jax.random.split(key, len(shapes)), strict=True):
        receptive = int(np.prod(shape[:-2]))
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        params[name] = {
            "w": jax.random.uniform(k, shape, minval=-limit, maxval=limit),
            "b": jax.numpy.zeros(shape[-1]),
        }
    return params


def _forward(jax: Any, params: dict[str, Any], x: Any, key: Any) -> Any:
    """Logits for NHWC images (uint8 0-255, scaled here, or float 0-1); dropout only when a PRNG
    ``key`` is given (training)."""
    jnp = jax.numpy
    if x.dtype == jnp.uint8:
        x = x.astype(jnp.float32) / 255.0

    def conv(x: Any, p: dict[str, Any]) -> Any:
        y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), "VALID", dimension_numbers=_DIMS)
        return jax.nn.relu(y + p["b"])

    def dropout(x: Any, rate: float, key: Any) -> Any:
        if key is None:
            return x
        keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), 0.0)

    k1, k2 = jax.random.split(key) if key is not None else (None, None)
    x = conv(conv(x, params["conv1"]), params["conv2"])
    x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    x = dropout(x, 0.25, k1).reshape(x.shape[0], -1)
    x = jax.nn.relu(x @ params["dense1"]["w"] + params["dense1"]["b"])
    x = dropout(x, 0.5, k2)
    return x @ params["dense2"]["w"] + params["dense2"]["b"]


_DIMS = ("NHWC", "HWIO", "NHWC")


def _train_step(
    jax: Any, params: Any, opt_state: Any, key: Any, sums: Any, x: Any, y: Any
) -> tuple[Any, Any, Any, Any]:
    """One Adadelta step; the running loss/accuracy sums ride along so nothing syncs per step."""
    jnp = jax.numpy
    key, sub = jax.random.split(key)

    def loss_fn(p: Any) -> tuple[Any, Any]:
        logits = _forward(jax, p, x, sub)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)), logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    acc_g, acc_dx = opt_state
    tm = jax.tree_util.tree_map
    acc_g = tm(lambda a, g: RHO * a + (1 - RHO) * g * g, acc_g, grads)
    delta = tm(lambda g, a, d: jnp.sqrt(d + EPS) / jnp.sqrt(a + EPS) * g, grads, acc_g, acc_dx)
    acc_dx = tm(lambda d, u: RHO * d + (1 - RHO) * u * u, acc_dx, delta)
    params = tm(lambda p, u: p - LR * u, params, delta)
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == y)
    sums = (sums[0] + loss * y.shape[0], sums[1] + correct)
    return params, (acc_g, acc_dx), key, sums


def _train_indexed(
    jax: Any, params: Any, opt_state: Any, key: Any, sums: Any, index: Any, xs: Any, ys: Any
) -> tuple[Any, Any, Any, Any, Any]:
    """``_train_step`` on batch ``index`` of an uploaded chunk; returns the next index too, so
    the index never leaves the device."""
    x = jax.lax.dynamic_index_in_dim(xs, index, keepdims=False)
    y = jax.lax.dynamic_index_in_dim(ys, index, keepdims=False)
    return (*_train_step(jax, params, opt_state, key, sums, x, y), index + 1)


if __name__ == "__main__":
    harness.main("jax", JaxTrainer)
