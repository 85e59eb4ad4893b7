"""A plain user's JAX MNIST loop: never imports memgov, sets no threads.

The Keras-example CNN, batch 32, host batches, one jit-compiled Adadelta(lr=1.0) step. Each epoch
is a fixed number of steps; per-epoch samples/s go to --out (JSON). Epoch 0 includes compilation.
    python benchmarks/workloads/plain_jax_mnist.py --epochs 4 --steps 400 --out job.json
"""

from __future__ import annotations

import os
import time

import _plain_common as common

args = common.parse("jax")
if args.device == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

RHO, EPS, LR = 0.95, 1e-7, 1.0
DIMS = ("NHWC", "HWIO", "NHWC")


def init(key):
    shapes = {"c1": (3, 3, 1, 32), "c2": (3, 3, 32, 64), "d1": (9216, 128), "d2": (128, 10)}
    params = {}
    for name, shape in shapes.items():
        key, sub = jax.random.split(key)
        fan_in = int(np.prod(shape[:-1]))
        fan_out = shape[-1] * (int(np.prod(shape[:-2])) if len(shape) == 4 else 1)
        limit = (6.0 / (fan_in + fan_out)) ** 0.5
        params[name] = {
            "w": jax.random.uniform(sub, shape, jnp.float32, -limit, limit),
            "b": jnp.zeros(shape[-1], jnp.float32),
        }
    return params


def forward(p, x, key):
    def conv(x, q):
        y = jax.lax.conv_general_dilated(x, q["w"], (1, 1), "VALID", dimension_numbers=DIMS)
        return jax.nn.relu(y + q["b"])

    def drop(x, rate, k):
        keep = jax.random.bernoulli(k, 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), 0.0)

    k1, k2 = jax.random.split(key)
    x = conv(conv(x, p["c1"]), p["c2"])
    x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    x = drop(x, 0.25, k1).reshape(x.shape[0], -1)
    x = drop(jax.nn.relu(x @ p["d1"]["w"] + p["d1"]["b"]), 0.5, k2)
    return x @ p["d2"]["w"] + p["d2"]["b"]


@jax.jit
def step(p, state, key, x, y):
    key, sub = jax.random.split(key)
    x = x.astype(jnp.float32)[..., None] / 255.0

    def loss_fn(q):
        logp = jax.nn.log_softmax(forward(q, x, sub))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1))

    loss, grads = jax.value_and_grad(loss_fn)(p)
    acc_g, acc_dx = state
    tm = jax.tree_util.tree_map
    acc_g = tm(lambda a, g: RHO * a + (1 - RHO) * g * g, acc_g, grads)
    delta = tm(lambda g, a, d: jnp.sqrt(d + EPS) / jnp.sqrt(a + EPS) * g, grads, acc_g, acc_dx)
    acc_dx = tm(lambda d, u: RHO * d + (1 - RHO) * u * u, acc_dx, delta)
    p = tm(lambda w, u: w - LR * u, p, delta)
    return p, (acc_g, acc_dx), key, loss


def main() -> None:
    report = common.Report("jax", args)
    if args.device == "gpu" and jax.default_backend() == "cpu":
        raise SystemExit("--device gpu: jax sees no GPU")
    key = jax.random.PRNGKey(args.seed)
    params = init(key)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    state = (zeros, zeros)
    x_all, y_all = common.data()
    rng = np.random.default_rng(args.seed)
    for epoch in range(args.epochs):
        t0 = time.time()
        samples = 0
        loss = None
        for xb, yb in common.batches(x_all, y_all, args.steps, args.batch, rng):
            params, state, key, loss = step(params, state, key, np.asarray(xb), np.asarray(yb))
            samples += len(yb)
        if loss is not None:
            loss.block_until_ready()
        report.epoch(epoch, samples, t0, time.time(), None)
    report.done(device=jax.default_backend(), jax=jax.__version__)


if __name__ == "__main__":
    main()
