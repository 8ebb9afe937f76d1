"""Grappler's memory optimizer on a virtual GPU whose memory is the limit LMS reports.

TensorFlow makes a GPU device's memory from its allocator's bytes_limit, and
Grappler's memory optimizer swaps tensors of GPU devices whose estimated peak
exceeds it (Note [The limit TensorFlow sees] in lms_allocator.cc). No GPU
here: the limit is read from the emulated device's allocator as TensorFlow
reads it, and Grappler runs on a virtual cluster with one GPU of that much
memory (and, for comparison, of the device's capacity alone), over a
training graph whose peak is above the device and below device plus host.
Prints one line ``RESULT <json>``.

Usage: python grappler.py   (TF_LMS_CPU_DEVICE_MEMORY_MB, TF_GPU_HOST_MEM_LIMIT_IN_MB)
"""

from __future__ import annotations

import ctypes
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow_lms_allocator as lms  # noqa: E402  (before tensorflow)
from tensorflow_lms_allocator.overlay import activation  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import config_pb2, device_properties_pb2  # noqa: E402
from tensorflow.python.framework import meta_graph  # noqa: E402
from tensorflow.python.grappler import cluster as grappler_cluster  # noqa: E402
from tensorflow.python.grappler import tf_optimizer  # noqa: E402

GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
SWAP_OPS = ("_CopyFromGpuToHost", "_CopyFromHostToGpu")


def training_graph() -> tf.Graph:
    """8 dense layers of 2048x2048 on GPU:0: weights and gradients 256 MiB."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(GPU):
        h = tf.random.normal([256, 2048], seed=1)
        weights = [tf.Variable(tf.random.normal([2048, 2048], stddev=0.01, seed=i))
                   for i in range(8)]
        for w in weights:
            h = tf.nn.relu(tf.matmul(h, w))
        grads = tf.gradients(tf.reduce_sum(h), weights)
        graph.add_to_collection(
            "train_op", tf.group(*[w.assign_sub(0.01 * g) for w, g in zip(weights, grads)]))
    return graph


def swap_nodes(memory_bytes: int) -> int:
    """Swap nodes Grappler's default passes insert for a GPU of that memory."""
    gpu = device_properties_pb2.DeviceProperties(
        type="GPU", memory_size=memory_bytes, frequency=1000, num_cores=100,
        bandwidth=900_000, environment={"architecture": "8"})
    cluster = grappler_cluster.Cluster(
        devices=[device_properties_pb2.NamedDevice(name=GPU, properties=gpu)])
    graph = tf_optimizer.OptimizeGraph(
        config_pb2.ConfigProto(), meta_graph.create_meta_graph_def(graph=training_graph()),
        cluster=cluster)
    return sum(node.op in SWAP_OPS for node in graph.node)


def main() -> None:
    device = tf.config.experimental.get_bytes_limit("CPU:0")  # makes the devices
    reported = ctypes.c_int64()
    code = activation.adapter().tf_lms_test_tensorflow_bytes_limit(b"CPU:0",
                                                                 ctypes.byref(reported))
    result = {"code": code, "reported": reported.value, "device": device,
              "lms_enabled": lms.get_lms_enabled(),
              "swaps_at_reported": swap_nodes(reported.value),
              "swaps_at_device": swap_nodes(device)}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
