"""XLA under LMS (Note [XLA under LMS] in tensorflow_lms_allocator/overlay/keras_jit.py).

Usage: python xla.py NAME
  auto       Keras sees a GPU (its physical device list says so, as on a GPU
             machine): what jit_compile="auto" and jit_compile=True resolve to,
             and what was logged
  loop       a custom training loop whose step is tf.function(jit_compile=True),
             one thread each, with other tensors held between steps so that
             the step's variables are evicted and paged in: losses and a
             checksum of the final weights
  oom        a Keras model with jit_compile=True whose XLA step does not fit the
             device: the error, then whether the model's variables survived
             unrelated allocations afterwards, and whether a later step works
Each prints ``RESULT <json>``. LMS_TEST_STOCK=1 runs without LMS.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys

if os.environ.get("LMS_TEST_STOCK") != "1":
    import tensorflow_lms_allocator as lms  # noqa: F401  (before tensorflow)
else:
    lms = None
import numpy as np
import tensorflow as tf

MIB = 1 << 20


def emit(result: dict) -> None:
    if lms is not None:
        result["stats"] = lms.get_statistics(0)
    print("RESULT " + json.dumps(result), flush=True)


def weights_digest(variables) -> str:
    digest = hashlib.sha256()
    for v in variables:
        digest.update(np.ascontiguousarray(v.numpy()).tobytes())
    return digest.hexdigest()


def small_model() -> tf.keras.Model:
    inputs = tf.keras.Input((32,))
    x = tf.keras.layers.Dense(64, activation="relu")(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))


def auto() -> None:
    from tensorflow.python.eager import context

    original = tf.config.list_physical_devices

    def with_a_gpu(device_type=None):
        devices = list(original(device_type))
        if device_type in (None, "GPU"):
            devices.append(context.PhysicalDevice("/physical_device:GPU:0", "GPU"))
        return devices

    tf.config.list_physical_devices = with_a_gpu
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("tensorflow").addHandler(Collect())
    resolved = {}
    for name, jit in (("auto", "auto"), ("auto_again", "auto"), ("true", True),
                      ("true_again", True), ("false", False)):
        model = small_model()
        model.compile(optimizer="sgd", loss="mse", jit_compile=jit)
        resolved[name] = model.jit_compile
    # The model trains with what was resolved (XLA runs on the CPU device).
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((64, 32), np.float32)
    history = model.fit(x, np.ones((64, 1), np.float32), batch_size=16, verbose=0)
    emit({"resolved": resolved, "logged": [r for r in records if "tensorflow_lms" in r],
          "trained": bool(np.isfinite(history.history["loss"][-1]))})


def loop() -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((1024,))
    x = inputs
    for _ in range(4):
        x = tf.keras.layers.Dense(1024, activation="relu")(x)  # 4 MiB weights each
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=True)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    data = tf.random.stateless_normal((8 * 64, 1024), seed=(1, 2))
    labels = tf.random.stateless_uniform((8 * 64,), seed=(3, 4), maxval=10, dtype=tf.int32)
    held: list[tf.Tensor] = []
    losses = []
    for i in range(8):
        losses.append(float(step(data[i * 64:(i + 1) * 64], labels[i * 64:(i + 1) * 64])))
        # Other tensors between steps push the step's variables out.
        held.append(tf.fill((6 * MIB,), float(i)))  # 24 MiB
        if len(held) > 2:
            held.pop(0)
    emit({"losses": losses, "weights": weights_digest(model.variables),
          "held_ok": [float(t[0]) for t in held] == [6.0, 7.0]})


def oom() -> None:
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((1024,))
    x = inputs
    for _ in range(3):
        x = tf.keras.layers.Dense(1024, activation="relu")(x)  # 4 MiB weights each
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
    model.compile(optimizer="adam", jit_compile=True,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # About 37 MiB of variables with Adam's slots; the XLA step needs about
    # 50 MiB more for its activations and gradients at batch 2048.
    x = np.ones((2048, 1024), np.float32)
    y = np.zeros((2048,), np.int32)
    model.predict(x[:8], verbose=0)  # builds the variables, outside XLA's step
    before = [v.numpy().copy() for v in model.variables]
    result: dict = {}
    try:
        model.fit(x, y, batch_size=2048, epochs=1, verbose=0)
        result["error"] = None
    except Exception as e:  # noqa: BLE001  (reported, not hidden)
        result["error"] = {"type": type(e).__name__, "message": str(e)[:2000]}
    after_error = [v.numpy().copy() for v in model.variables]
    fills = []  # unrelated allocations: they must not take the variables' memory
    try:
        for _ in range(8):
            fills.append(tf.fill((1 * MIB,), 7.0))
    except tf.errors.ResourceExhaustedError:
        pass  # without LMS the device is full (of the variables, as it should be)
    result["fills"] = len(fills)
    after_fills = [v.numpy() for v in model.variables]
    result["variables_changed_by_the_failed_step"] = sum(
        not np.array_equal(a, b) for a, b in zip(before, after_error))
    result["variables_changed_by_unrelated_fills"] = sum(
        not np.array_equal(a, b) for a, b in zip(after_error, after_fills))
    result["fills_ok"] = all(float(tf.reduce_min(f)) == 7.0 for f in fills)
    model.compile(optimizer="adam", jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    try:
        history = model.fit(x[:32], y[:32], batch_size=32, epochs=1, verbose=0)
        result["later_step"] = {"loss": history.history["loss"][-1]}
    except Exception as e:  # noqa: BLE001
        result["later_step"] = {"type": type(e).__name__, "message": str(e)[:500]}
    emit(result)


if __name__ == "__main__":
    {"auto": auto, "loop": loop, "oom": oom}[sys.argv[1]]()
