"""Trains a small convolutional model with tf.distribute.MirroredStrategy over two
logical CPU devices (CPU:0 and CPU:1, one emulated device split in two, so both
replicas allocate from the same LMS allocator) and prints one line
``RESULT <json>``: the losses, a digest of the final weights, the error if any,
and the LMS statistics.

Usage: python mirrored.py [--steps N] [--batch B]  (B images per replica)
The environment decides the allocator, as for train.py. One intra-op and one
inter-op thread and op determinism make runs bit-identical;
LMS_TEST_INTER_OP_THREADS=N runs the replicas' kernels on N inter-op
threads instead (concurrent kernels, which take turns for memory).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

os.environ["TF_NUM_INTEROP_THREADS"] = os.environ.get("LMS_TEST_INTER_OP_THREADS", "1")
os.environ["TF_NUM_INTRAOP_THREADS"] = "1"
if os.environ.get("LMS_TEST_STOCK") != "1":
    import tensorflow_lms_allocator as lms  # noqa: F401  (before tensorflow)
import keras
import numpy as np
import tensorflow as tf

IMAGE, CHANNELS, LAYERS, CLASSES = 64, 16, 16, 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(1)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    global_batch = args.batch * strategy.num_replicas_in_sync
    with strategy.scope():
        inputs = keras.Input((IMAGE, IMAGE, 3))
        x = inputs
        for _ in range(LAYERS):
            x = keras.layers.Conv2D(CHANNELS, 3, padding="same", activation="relu")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model = keras.Model(inputs, keras.layers.Dense(CLASSES)(x))
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)  # its slots mirrored, before tracing
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    rng = np.random.default_rng(0)
    images = rng.standard_normal((global_batch * args.steps, IMAGE, IMAGE, 3), dtype=np.float32)
    labels = rng.integers(0, CLASSES, global_batch * args.steps).astype(np.int32)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch))

    @tf.function
    def train_step(batch):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                  global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    result: dict = {"losses": [], "error": None, "replicas": strategy.num_replicas_in_sync}
    try:
        for batch in dataset:
            result["losses"].append(float(train_step(batch)))
        digest = hashlib.sha256()
        for w in model.get_weights():
            digest.update(np.asarray(w).tobytes())
        result["weights"] = digest.hexdigest()
    except tf.errors.ResourceExhaustedError as error:
        result["error"] = {"type": "ResourceExhaustedError", "message": error.message}
    if "tensorflow_lms_allocator" in sys.modules:
        result["stats"] = lms.get_statistics(0)
        result["devices"] = lms.device_names()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
