"""Programs made of tensors under one granule (2 MiB), on a 64 or 56 MiB device.

Usage: python small_objects.py NAME
  freed_small_then_large   50 tensors of 1 MiB created and freed, then a 40 MiB one
  mlp                      a Keras MLP of 24 Dense(512) layers (1 MiB weights), SGD with
                           momentum, trained 3 steps; every weight, slot and activation
                           is a small tensor
Each prints ``RESULT <json>`` with the outcome and the LMS statistics.
"""

from __future__ import annotations

import json
import sys

import tensorflow_lms_allocator as lms  # before tensorflow
import tensorflow as tf

MIB = 1 << 20


def emit(result: dict) -> None:
    result["stats"] = lms.get_statistics(0)
    print("RESULT " + json.dumps(result), flush=True)


def freed_small_then_large() -> None:
    small = [tf.fill((MIB // 4,), float(i)) for i in range(50)]  # 1 MiB each
    sums = [float(tf.reduce_sum(t)) for t in small]
    del small
    big = tf.fill((10 * MIB,), 3.0)  # 40 MiB
    emit({"sums_ok": sums == [float(i) * (MIB // 4) for i in range(50)],
          "big": float(tf.reduce_min(big))})


def mlp() -> None:
    # One thread each: CPU kernels are deterministic only so (docs/design.md), and
    # the test compares losses bit for bit.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((512,))
    x = inputs
    for _ in range(24):
        x = tf.keras.layers.Dense(512, activation="relu")(x)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.random.stateless_normal((3 * 256, 512), seed=(1, 2))
    labels = tf.random.stateless_uniform((3 * 256,), seed=(3, 4), maxval=10, dtype=tf.int32)
    history = model.fit(data, labels, batch_size=256, epochs=1, verbose=0, shuffle=False)
    emit({"loss": history.history["loss"][-1]})


if __name__ == "__main__":
    {"freed_small_then_large": freed_small_then_large, "mlp": mlp}[sys.argv[1]]()
