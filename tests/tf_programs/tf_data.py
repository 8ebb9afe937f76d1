"""tf.data pipelines under memory pressure, with known contents in every byte.

Usage: python tf_data.py NAME [--runs N]
  pipeline   Dataset.range(160).map(f, num_parallel_calls=4).batch(4).prefetch(3):
             element i is int32 i * 1000003 + position (3 MiB), a batch 12 MiB;
             the main thread makes memory pressure (8 MiB tensors) while the
             pipeline's threads fill the next batches. Every batch is checked
             whole, by .numpy() and by a kernel (count of mismatches against
             the expected values computed on the device). Runs N times in the
             process (a fresh pipeline each time).
  fit        a Keras model trained on a tf.data pipeline (map + batch + prefetch),
             one thread each (bit-exact comparisons need it, docs/design.md); prints
             its losses and final weights' checksum
  batches MODEL PIPELINE  Keras fit of MODEL ("mlp": 30 Dense(256) layers and a
             Dense(4096), Adam, 30 batches of 32x1024 floats, 128 KiB, with
             .prefetch(16); "mobilenet": MobileNetV3Small at 96x96, 12 batches
             of 8, 0.8 MiB, with .prefetch(4)) on batches made by tf.data's
             .batch() outside kernels (PIPELINE "outside") or by a kernel
             (.map(lambda x, y: (x + 0.0, y)): "kernel"); one thread each
Each prints ``RESULT <json>`` with the outcome and the LMS statistics.
The tf.data batch is allocated on a tf.data thread, outside any kernel, and
written there while other threads run kernels (Note [Writers outside
kernels] in engine.h): before the fix, evictions under pressure lost part of
those writes in 1-4 of 40 batches per run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

if os.environ.get("LMS_TEST_STOCK") != "1":
    import tensorflow_lms_allocator as lms  # noqa: F401  (before tensorflow)
else:
    lms = None
import numpy as np
import tensorflow as tf

from models import small_cnn

ELEMENT_VALUES = (3 << 20) // 4  # int32 values per element: 3 MiB
PER_BATCH = 4
BATCHES = 40
MULTIPLIER = 1000003


def element(i: tf.Tensor) -> tf.Tensor:
    return tf.cast(i, tf.int32) * MULTIPLIER + tf.range(ELEMENT_VALUES, dtype=tf.int32)


def expected_batch(b: int) -> np.ndarray:
    first = b * PER_BATCH
    rows = np.arange(first, first + PER_BATCH, dtype=np.int64)[:, None] * MULTIPLIER
    return (rows + np.arange(ELEMENT_VALUES)[None, :]).astype(np.int32)


@tf.function
def kernel_mismatches(batch: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """What a kernel sees: the values of `batch` that differ from the expected."""
    rows = tf.range(b * PER_BATCH, (b + 1) * PER_BATCH, dtype=tf.int32)[:, None]
    expected = rows * MULTIPLIER + tf.range(ELEMENT_VALUES, dtype=tf.int32)[None, :]
    return tf.reduce_sum(tf.cast(tf.not_equal(batch, expected), tf.int64))


def one_run() -> dict:
    ds = (tf.data.Dataset.range(BATCHES * PER_BATCH)
          .map(element, num_parallel_calls=4).batch(PER_BATCH).prefetch(3))
    pressure: list[tf.Tensor] = []
    bad_batches: list[int] = []
    numpy_bad = kernel_bad = 0
    for b, batch in enumerate(ds):
        pressure.append(tf.fill((2 << 20,), float(b)))  # 8 MiB made by a kernel
        if len(pressure) > 3:
            pressure.pop(0)
        by_kernel = int(kernel_mismatches(batch, tf.constant(b, tf.int32)))
        by_numpy = int(np.count_nonzero(batch.numpy() != expected_batch(b)))
        if by_kernel or by_numpy:
            bad_batches.append(b)
        numpy_bad += by_numpy
        kernel_bad += by_kernel
    return {"batches": b + 1, "bad_batches": bad_batches, "numpy_bad_values": numpy_bad,
            "kernel_bad_values": kernel_bad}


def pipeline(runs: int) -> dict:
    return {"runs": [one_run() for _ in range(runs)]}


def fit(runs: int) -> dict:
    del runs
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(0)

    def example(i):
        i = tf.cast(i, tf.float32)
        x = tf.sin(i * 0.37 + tf.range(64 * 64 * 3, dtype=tf.float32) * 0.01)
        return tf.reshape(x, (64, 64, 3)), tf.cast(tf.math.floormod(i, 10.0), tf.int32)

    ds = (tf.data.Dataset.range(4 * 32).map(example, num_parallel_calls=4)
          .batch(32).prefetch(3))
    model = small_cnn(conv_layers=6)
    losses: list[float] = []
    cb = tf.keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: losses.append(float(logs["loss"])))
    model.fit(ds, epochs=2, verbose=0, callbacks=[cb])
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(np.ascontiguousarray(w).tobytes())
    return {"losses": losses, "weights": digest.hexdigest()}


def batches(model_name: str, made: str) -> dict:
    """Overflow placements with batches made outside kernels or by a kernel
    (Note [Writer pages] in cc/engine/small_pages.h)."""
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(0)
    data = np.random.RandomState(0)
    if model_name == "mlp":
        inputs = tf.keras.Input((1024,))
        x = inputs
        for _ in range(30):
            x = tf.keras.layers.Dense(256, activation="relu")(x)
        x = tf.keras.layers.Dense(4096, activation="relu")(x)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
        steps, batch, prefetch, shape = 30, 32, 16, (1024,)
    else:
        model = tf.keras.applications.MobileNetV3Small(input_shape=(96, 96, 3), weights=None,
                                                       classes=10)
        steps, batch, prefetch, shape = 12, 8, 4, (96, 96, 3)
    xs = data.rand(steps * batch, *shape).astype(np.float32)
    ys = data.randint(0, 10, steps * batch).astype(np.int32)
    model.compile(optimizer="adam",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(batch)
    if made == "kernel":
        ds = ds.map(lambda x, y: (x + 0.0, y))
    history = model.fit(ds.prefetch(prefetch), epochs=1, verbose=0)
    return {"loss": history.history["loss"][-1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=["pipeline", "fit", "batches"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    if args.name == "batches":
        result = batches(*args.args)
    else:
        result = {"pipeline": pipeline, "fit": fit}[args.name](args.runs)
    if lms is not None:
        result["stats"] = lms.get_statistics(0)
        result["unpinned_touches"] = len(lms.unpinned_touches())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
