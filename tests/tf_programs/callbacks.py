"""Trains a small Keras model over an emulated device cap with every LMS
callback, then a tf.compat.v1 graph under MonitoredTrainingSession with the
session hook, and prints one line ``RESULT <json>``: what the public getters
returned at the end of each batch (read right after the callbacks), the
statistics after training, and the messages of the callbacks' argument
errors.

Usage: python callbacks.py OUT_DIR [--steps N] [--epochs E] [--batch B]
Writes OUT_DIR/fit.csv, fit_every2.csv, average.json, average_unfinished.json,
tensorboard/ and session.csv; then, from a model compiled with
steps_per_execution=4 (two epochs of 4 steps), spe4.csv, spe4_every8.csv,
spe4_average.json and spe4_tensorboard/.

Run with TF_LMS_CPU_DEVICE_MEMORY_MB (about 48) and TF_LMS_ENABLED=1: the
model's batch needs more than that, so every step evicts and pages in.
"""

from __future__ import annotations

import argparse
import json
import os

import tensorflow_lms_allocator as lms  # before tensorflow
import numpy as np
import tensorflow as tf

from tensorflow_lms_allocator.callbacks import (
    LMSStatsAverage,
    LMSStatsLogger,
    LMSStatsSessionHook,
    LMSStatsTensorBoard,
)

FEATURES, WIDTH, LAYERS = 64, 512, 6


def getters(device: int = 0) -> dict[str, int]:
    """Every statistic through the public getters (tf.config.experimental.get_*)."""
    return {engine: getattr(tf.config.experimental, public)(device)
            for public, engine in lms.lms.STATISTICS.items()}


class GetterProbe(tf.keras.callbacks.Callback):
    """Reads the public getters at the end of each batch, after the LMS callbacks."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, int]] = []

    def on_train_batch_end(self, batch, logs=None):
        row = getters()
        engine = lms.get_statistics(0)  # what has no public getter
        row.update({name: engine[name] for name in engine if name not in row})
        self.rows.append(row)


def model() -> tf.keras.Model:
    inputs = tf.keras.Input((FEATURES,))
    x = inputs
    for _ in range(LAYERS):
        x = tf.keras.layers.Dense(WIDTH, activation="tanh")(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))


def fit(out: str, steps: int, epochs: int, batch: int) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, FEATURES), dtype=np.float32)
    y = rng.standard_normal((steps * batch, 1), dtype=np.float32)
    # Batches read synchronously inside the step (no background prefetch), so
    # nothing allocates between the callbacks' reads and the probe's.
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).with_options(options)
    m = model()
    m.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    probe = GetterProbe()
    total = steps * epochs
    callbacks = [
        LMSStatsLogger(os.path.join(out, "fit.csv")),
        probe,  # right after the logger: no op runs between their reads
        LMSStatsLogger(os.path.join(out, "fit_every2.csv"), device="CPU:0",
                       statistics=["get_bytes_reclaimed", "num_page_ins"], every_n_batches=2),
        LMSStatsAverage(os.path.join(out, "average.json"), start_batch=2,
                        end_batch=total - 2),
        LMSStatsAverage(os.path.join(out, "average_unfinished.json"), start_batch=1,
                        end_batch=total + 10),
        LMSStatsTensorBoard(os.path.join(out, "tensorboard")),
    ]
    m.fit(dataset, epochs=epochs, verbose=0, callbacks=callbacks)
    return {"probe": probe.rows, "after": lms.get_statistics(0)}


def fit_per_execution(out: str, batch: int) -> dict:
    """Two epochs of 4 steps with steps_per_execution=4: one execution per epoch."""
    steps, epochs = 4, 2
    rng = np.random.default_rng(1)
    x = rng.standard_normal((steps * batch, FEATURES), dtype=np.float32)
    y = rng.standard_normal((steps * batch, 1), dtype=np.float32)
    m = model()
    m.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=4)
    callbacks = [
        LMSStatsLogger(os.path.join(out, "spe4.csv")),
        LMSStatsLogger(os.path.join(out, "spe4_every8.csv"), every_n_batches=8),
        LMSStatsAverage(os.path.join(out, "spe4_average.json"), start_batch=5, end_batch=6),
        LMSStatsTensorBoard(os.path.join(out, "spe4_tensorboard")),
    ]
    m.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False,
          callbacks=callbacks)
    return {"steps": steps * epochs}


def session(out: str, steps: int, batch: int) -> dict:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        xb = tf.random.normal((batch, FEATURES))
        h = xb
        for i in range(LAYERS):
            w = tf.compat.v1.get_variable(f"w{i}", (h.shape[1], WIDTH))
            h = tf.tanh(tf.matmul(h, w))
        loss = tf.reduce_mean(h * h)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            loss, global_step=global_step)
        hooks = [LMSStatsSessionHook(os.path.join(out, "session.csv")),
                 tf.compat.v1.train.StopAtStepHook(last_step=steps)]
        runs = 0
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            while not sess.should_stop():
                sess.run(train)
                runs += 1
    return {"runs": runs, "after": lms.get_statistics(0)}


def argument_errors(out: str) -> dict[str, str]:
    """The message of each bad argument's error (or "no error")."""
    cases = {
        "every_n_batches": lambda: LMSStatsLogger(os.path.join(out, "x.csv"),
                                                  every_n_batches=-1),
        "statistics": lambda: LMSStatsLogger(os.path.join(out, "x.csv"),
                                             statistics=["bytes_reclaimed", "bogus"]),
        "end_batch": lambda: LMSStatsAverage(os.path.join(out, "x.json"), 5, 3),
        "start_batch": lambda: LMSStatsAverage(os.path.join(out, "x.json"), -1, 3),
        "device_index": lambda: LMSStatsLogger(os.path.join(out, "x.csv"), device=3),
        "device_gpu": lambda: LMSStatsTensorBoard(os.path.join(out, "tb"), device="GPU:0"),
        "every_n_steps": lambda: LMSStatsSessionHook(os.path.join(out, "x.csv"),
                                                     every_n_steps=0),
    }
    messages = {}
    for name, make in cases.items():
        try:
            make()
            messages[name] = "no error"
        except ValueError as error:
            messages[name] = f"ValueError: {error}"
    return messages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4096)
    args = parser.parse_args()
    tf.keras.utils.set_random_seed(1)
    result = {"fit": fit(args.out, args.steps, args.epochs, args.batch),
              "session": session(args.out, args.steps, args.batch),
              "per_execution": fit_per_execution(args.out, args.batch),
              "errors": argument_errors(args.out),
              "statistics": lms.callbacks.statistic_names()}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
