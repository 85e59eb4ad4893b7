"""Keras-example MNIST CNN in TensorFlow/Keras. Run ``python train_tensorflow.py --help``.

A custom loop (one ``tf.function`` step) rather than ``model.fit``, so batches come from the
same shared host-side loader as the other frameworks and epoch timing is measured the same way.
Framework-only on purpose: memgov governs this process from outside (env vars, import hook), so
nothing here imports memgov or sets thread counts.
"""

from __future__ import annotations

import argparse
import os

import harness
import numpy as np
import report


class TensorflowTrainer:
    channels_last = True

    def __init__(self, args: argparse.Namespace) -> None:
        if args.device == "cpu":
            # Hidden before import, TF never creates a CUDA context: a CPU job costs the GPU
            # nothing, whatever else configures TF's GPUs at import time.
            os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
        import tensorflow as tf
        from tensorflow import keras

        self.tf = tf
        gpus = tf.config.list_physical_devices("GPU")
        if args.device == "gpu" and not gpus:
            raise report.UsageError("--device gpu: tensorflow sees no GPU")
        self.device = "cuda:0" if gpus else "cpu"
        self.tf_device = "/GPU:0" if gpus else "/CPU:0"
        keras.utils.set_random_seed(args.seed)

        layers = keras.layers
        self.model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                layers.Conv2D(32, 3, activation="relu"),
                layers.Conv2D(64, 3, activation="relu"),
                layers.MaxPooling2D(2),
                layers.Dropout(0.25),
                layers.Flatten(),
                layers.Dense(128, activation="relu"),
                layers.Dropout(0.5),
                layers.Dense(10),  # logits; softmax is folded into the loss
            ]
        )
        opt = keras.optimizers.Adadelta(learning_rate=1.0, rho=0.95, epsilon=1e-7)
        # Building up front keeps variable creation out of the traced step.
        opt.build(self.model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.loss_sum = tf.Variable(0.0)
        self.correct = tf.Variable(0.0)
        model, variables = self.model, self.model.trainable_variables
        images = tf.TensorSpec([None, 28, 28, 1], tf.float32)

        # Fixed signature: a short last batch must not retrace the step.
        @tf.function(input_signature=[images, tf.TensorSpec([None], tf.int64)])
        def step(x: tf.Tensor, y: tf.Tensor) -> None:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
            # Running sums live in variables so the host never waits on the device per step.
            self.loss_sum.assign_add(loss * tf.cast(tf.shape(y)[0], tf.float32))
            hits = tf.equal(tf.argmax(logits, axis=1), y)
            self.correct.assign_add(tf.reduce_sum(tf.cast(hits, tf.float32)))

        @tf.function(input_signature=[images])
        def predict(x: tf.Tensor) -> tf.Tensor:
            return tf.argmax(model(x, training=False), axis=1)

        self._step, self._predict = step, predict

    def train_epoch(self, batches: harness.Batches) -> tuple[float, float]:
        self.loss_sum.assign(0.0)
        self.correct.assign(0.0)
        n = 0
        for xb, yb in batches:
            self._step(xb, yb)
            n += len(yb)
        # .numpy() waits for the device, so the epoch time includes all queued steps.
        return float(self.loss_sum.numpy()) / n, float(self.correct.numpy()) / n

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self._predict(x).numpy()

    def hog(self, mib: int) -> object:
        tf = self.tf
        with tf.device(self.tf_device):
            held = tf.ones([mib << 20], dtype=tf.uint8)
        # Eager ops may run asynchronously; touching a value forces the allocation now.
        held[:1].numpy()
        return held

    def peak_allocator_mib(self) -> float | None:
        if self.device == "cpu":
            return None
        try:
            peak = self.tf.config.experimental.get_memory_info("GPU:0")["peak"]
        except (ValueError, KeyError):  # allocator without statistics
            return None
        return round(peak / 2**20, 1)


if __name__ == "__main__":
    harness.main("tensorflow", TensorflowTrainer)
