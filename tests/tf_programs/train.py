"""Trains a small convolutional model on the (emulated) CPU device and prints
one JSON line: the losses, the error if any, and the LMS statistics.

Usage: python train.py MODE [--steps N] [--batch B]
MODE: fit (Keras fit), loop (custom loop under tf.function), eager (plain
eager ops, no tf.function), session (tf.compat.v1 graph and Session).

The environment decides the allocator: nothing set is stock TensorFlow;
TF_LMS_CPU_DEVICE_MEMORY_MB caps the device, TF_LMS_ENABLED turns LMS on;
with LMS_TEST_LRU_ORDER_FROM=K, fit's reclaims take LRU's order from batch K.
Peak memory at batch 32 is about 160 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if os.environ.get("LMS_TEST_STOCK") != "1":
    import tensorflow_lms_allocator as lms  # noqa: F401  (before tensorflow)
import numpy as np
import tensorflow as tf

IMAGE, CHANNELS, LAYERS, CLASSES = 64, 32, 8, 10


def data(batch: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * steps, IMAGE, IMAGE, 3), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch * steps).astype(np.int32)
    return x, y


def keras_model() -> tf.keras.Model:
    inputs = tf.keras.Input((IMAGE, IMAGE, 3))
    x = inputs
    for _ in range(LAYERS):
        x = tf.keras.layers.Conv2D(CHANNELS, 3, padding="same", activation="relu")(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(CLASSES)(x))


def loss_fn(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def lru_order_from(batch: int, result: dict) -> None:
    """From `batch` on, reclaims take LRU's order while the learned policy goes
    on learning (a test entry point); result["at_switch"] gets the statistics then."""
    if batch != int(os.environ.get("LMS_TEST_LRU_ORDER_FROM", "-1")):
        return
    from tensorflow_lms_allocator.overlay import activation

    result["at_switch"] = lms.get_statistics(0)
    activation.set_learned_order(lms.device_names()[0], False)


def train_fit(x, y, batch, result):
    model = keras_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    losses = []
    cb = tf.keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: lru_order_from(b, result),
        on_train_batch_end=lambda b, logs: losses.append(float(logs["loss"])))
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    return losses


def train_loop(x, y, batch, compiled: bool):
    model = keras_model()
    optimizer = tf.keras.optimizers.SGD(0.01)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if compiled:
        step = tf.function(step)
    return [float(step(x[i:i + batch], y[i:i + batch])) for i in range(0, len(x), batch)]


def train_session(x, y, batch):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        xb = tf.compat.v1.placeholder(tf.float32, (batch, IMAGE, IMAGE, 3))
        yb = tf.compat.v1.placeholder(tf.int32, (batch,))
        h, channels = xb, 3
        init = tf.compat.v1.glorot_uniform_initializer(seed=1)
        for i in range(LAYERS):
            w = tf.compat.v1.get_variable(f"w{i}", (3, 3, channels, CHANNELS), initializer=init)
            h = tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME"))
            channels = CHANNELS
        w = tf.compat.v1.get_variable("dense", (CHANNELS, CLASSES), initializer=init)
        loss = loss_fn(yb, tf.matmul(tf.reduce_mean(h, axis=(1, 2)), w))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return [float(session.run([loss, train], {xb: x[i:i + batch], yb: y[i:i + batch]})[0])
                    for i in range(0, len(x), batch)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["fit", "loop", "eager", "session"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    tf.keras.utils.set_random_seed(1)
    tf.config.experimental.enable_op_determinism()
    x, y = data(args.batch, args.steps)
    result: dict = {"losses": [], "error": None}
    try:
        if args.mode == "fit":
            result["losses"] = train_fit(x, y, args.batch, result)
        elif args.mode in ("loop", "eager"):
            result["losses"] = train_loop(x, y, args.batch, compiled=args.mode == "loop")
        else:
            result["losses"] = train_session(x, y, args.batch)
    except tf.errors.ResourceExhaustedError as error:
        result["error"] = {"type": "ResourceExhaustedError", "message": error.message}
    if "tensorflow_lms_allocator" in sys.modules:
        try:
            result["stats"] = lms.get_statistics(0)
        except ValueError:
            result["stats"] = None
        result["touches"] = [t.__dict__ for t in lms.unpinned_touches()]
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
