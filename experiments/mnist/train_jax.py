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
# Steps per upload. Handing each batch to the jitted step as a numpy array copies it to the device
# synchronously, so host and GPU never overlap: on an H200 the per-step loop ran 42,141 samples/s
# and the same step on batches already on the device 82,189 (benchmarks/gpu/jax_trainer_probe.py,
# docs/RESULTS.md). Stacking CHUNK batches into one upload and running them with one lax.scan
# keeps batches on the host, shuffled per epoch, at one transfer and one dispatch per CHUNK steps.
CHUNK = 64


class JaxTrainer:
    channels_last = True

    def __init__(self, args: argparse.Namespace) -> None:
        if args.device == "cpu":
            # Read when the backend initialises, so it must be set before jax is imported.
            os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
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
        self._step = jax.jit(functools.partial(_train_step, jax), donate_argnums=(0, 1, 2, 3))
        self._chunk = jax.jit(functools.partial(_train_chunk, jax), donate_argnums=(0, 1, 2, 3))
        self._predict = jax.jit(lambda p, x: jnp.argmax(_forward(jax, p, x, None), axis=-1))

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
        """Run up to CHUNK equal-sized batches as one upload and one scan.

        A chunk is always padded to CHUNK steps, so the scan compiles once; padded steps are
        marked invalid and leave every state untouched (their compute is wasted, at most
        CHUNK - 1 steps an epoch).
        """
        xs = np.stack([x for x, _ in pending])
        ys = np.stack([y for _, y in pending]).astype(np.int32)
        valid = np.zeros(CHUNK, dtype=bool)
        valid[: len(pending)] = True
        if len(pending) < CHUNK:
            pad = CHUNK - len(pending)
            xs = np.concatenate([xs, np.zeros((pad, *xs.shape[1:]), xs.dtype)])
            ys = np.concatenate([ys, np.zeros((pad, *ys.shape[1:]), ys.dtype)])
        *new_state, sums = self._chunk(*state, sums, xs, ys, valid)
        return tuple(new_state), sums

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._predict(self.params, x))

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
    """Logits for NHWC images; dropout only when a PRNG ``key`` is given (training)."""
    jnp = jax.numpy

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


def _train_chunk(
    jax: Any, params: Any, opt_state: Any, key: Any, sums: Any, xs: Any, ys: Any, valid: Any
) -> tuple[Any, Any, Any, Any]:
    """``_train_step`` over a stack of batches in one ``lax.scan``; invalid (padding) steps are
    computed and dropped, so every state is exactly as after the valid steps alone."""
    jnp = jax.numpy

    def body(carry: Any, item: Any) -> tuple[Any, None]:
        x, y, ok = item
        new = _train_step(jax, *carry, x, y)
        kept = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), new, carry)
        return kept, None

    carry, _ = jax.lax.scan(body, (params, opt_state, key, sums), (xs, ys, valid))
    return carry


if __name__ == "__main__":
    harness.main("jax", JaxTrainer)
