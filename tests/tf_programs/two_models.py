"""Trains THREADS models at once, one per Python thread, on the emulated device.

Not yet in the suite: two models at 72-88 MiB (each fits alone in 64) both
failed every time before kernels took turns (Note [Taking turns] in
cc/tf_adapter/kernel_pins.h) and usually both finish with turns, but not
every time, so no test asserts it yet.

Usage: python two_models.py THREADS [--steps N] [--batch B]

Each thread builds its own small convolutional model and runs its own
tf.function training steps; the threads share the device (and LMS). Prints
``RESULT <json>`` with each thread's error (or None), its losses and the LMS
statistics.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import tensorflow_lms_allocator as lms  # before tensorflow
import tensorflow as tf

IMAGE, CHANNELS, LAYERS, CLASSES = 64, 32, 8, 10


def train(index: int, steps: int, batch: int, results: list) -> None:
    try:
        tf.random.set_seed(index)
        inputs = tf.keras.Input((IMAGE, IMAGE, 3))
        x = inputs
        for _ in range(LAYERS):
            x = tf.keras.layers.Conv2D(CHANNELS, 3, padding="same", activation="relu")(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(CLASSES)(x))
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

        losses = [float(step()) for _ in range(steps)]
        results[index] = {"error": None, "losses": losses}
    except Exception as error:  # noqa: BLE001  (reported, not raised)
        results[index] = {"error": {"type": type(error).__name__,
                                    "message": str(error)[:1500]}, "losses": []}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("threads", type=int)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    results: list = [None] * args.threads
    threads = [threading.Thread(target=train, args=(i, args.steps, args.batch, results))
               for i in range(args.threads)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("RESULT " + json.dumps({"threads": results, "stats": lms.get_statistics(0),
                                  "seconds": time.perf_counter() - start}), flush=True)


if __name__ == "__main__":
    main()
