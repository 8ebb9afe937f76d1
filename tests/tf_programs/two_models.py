"""Trains THREADS models at once, one per Python thread, on the emulated device.

Usage: python two_models.py THREADS [--steps N] [--batch B] [--alone]

Each thread builds its own small convolutional model (weights seeded by its
index) and runs its own tf.function training steps on its own data; the
threads share the device (and LMS). Every kernel runs single-threaded (one
intra-op thread, op determinism), so a model's losses do not depend on what
else runs; two inter-op threads let the two models' kernels run at the same
time (with one, they would only ever run one after the other). With --alone,
each model is then trained again, by itself, from the same initial weights,
for the losses to compare.

Prints ``RESULT <json>``: each thread's error (or None) and losses, the
losses of each model trained alone (with --alone), the LMS statistics and
the kernels' turns (Note [Taking turns] in cc/tf_adapter/kernel_pins.h).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import threading
import time

import tensorflow_lms_allocator as lms  # before tensorflow
from tensorflow_lms_allocator.overlay import activation

import tensorflow as tf

IMAGE, CHANNELS, LAYERS, CLASSES = 64, 32, 8, 10


def turns() -> dict | None:
    """Requests that waited for memory, and waits broken as deadlocks (None
    from an adapter that does not count them)."""
    out = (ctypes.c_int64 * 2)()
    lib = activation.adapter()
    if not hasattr(lib, "tf_lms_turns"):
        return None
    assert lib.tf_lms_turns(out) == 0, "no LMS device"
    return {"waits": out[0], "deadlocks": out[1]}


def train(index: int, steps: int, batch: int) -> dict:
    """Trains model `index` for `steps` steps; returns its losses or error."""
    try:
        def seeded(layer: int) -> tf.keras.initializers.Initializer:
            return tf.keras.initializers.GlorotUniform(seed=1000 * index + layer)

        inputs = tf.keras.Input((IMAGE, IMAGE, 3))
        x = inputs
        for layer in range(LAYERS):
            x = tf.keras.layers.Conv2D(CHANNELS, 3, padding="same", activation="relu",
                                       kernel_initializer=seeded(layer))(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        logits_layer = tf.keras.layers.Dense(CLASSES, kernel_initializer=seeded(LAYERS))
        model = tf.keras.Model(inputs, logits_layer(x))
        optimizer = tf.keras.optimizers.SGD(0.01)
        images = tf.random.stateless_normal((batch, IMAGE, IMAGE, 3), seed=(index, 1))
        labels = tf.random.stateless_uniform((batch,), seed=(index, 2), maxval=CLASSES,
                                             dtype=tf.int32)

        @tf.function
        def step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return {"error": None, "losses": [float(step()) for _ in range(steps)]}
    except Exception as error:  # noqa: BLE001  (reported, not raised)
        return {"error": {"type": type(error).__name__, "message": str(error)[:1500]},
                "losses": []}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("threads", type=int)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--alone", action="store_true",
                        help="then train each model by itself, for reference losses")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)  # see the docstring
    tf.config.experimental.enable_op_determinism()

    results: list = [None] * args.threads

    def run(index: int) -> None:
        results[index] = train(index, args.steps, args.batch)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    stats, taken = lms.get_statistics(0), turns()
    alone = ([train(i, args.steps, args.batch) for i in range(args.threads)]
             if args.alone else None)
    print("RESULT " + json.dumps({"threads": results, "alone": alone, "stats": stats,
                                  "turns": taken, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
