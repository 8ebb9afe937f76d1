"""An asynchronous collective kernel keeps what it uses pinned until it is done.

Two logical CPU devices of one emulated device; participant A's
CollectiveReduceV2 (an AsyncOpKernel, like NcclAllReduce on a GPU) starts on
a thread and waits for participant B. Meanwhile the main thread makes the
device evict. Prints one line ``RESULT <json>``: bytes_active before, while A
waits and after; evictions made while A waited; whether every element of both
results is the known sum; strict mode's unpinned touches.

Usage: python collectives.py   (the environment decides the allocator)
"""

from __future__ import annotations

import json
import os
import threading
import time

os.environ.setdefault("TF_NUM_INTEROP_THREADS", "2")
import tensorflow_lms_allocator as lms  # noqa: E402  (before tensorflow)
import tensorflow as tf  # noqa: E402

ELEMENTS = 2 << 20  # 8 MiB of int32 for each participant


def reduce(device: str, x: tf.Tensor, out: dict[str, tf.Tensor], key: str) -> None:
    with tf.device(device):
        out[key] = tf.raw_ops.CollectiveReduceV2(
            input=x, group_size=tf.constant(2), group_key=tf.constant(1),
            instance_key=tf.constant(1), ordering_token=[], merge_op="Add", final_op="Id")


def two_participants() -> tuple[tf.Tensor, tf.Tensor]:
    """CPU:0 and CPU:1 (one emulated device split in two), and each one's input."""
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    with tf.device("CPU:0"):
        a = tf.range(ELEMENTS, dtype=tf.int32)
    with tf.device("CPU:1"):
        b = tf.range(ELEMENTS, dtype=tf.int32) * 3
    return a, b


def finish(waiting: threading.Thread, b: tf.Tensor, out: dict[str, tf.Tensor],
           result: dict) -> None:
    """Records whether A still waits, brings B, and checks both results."""
    result["a_still_waiting"] = waiting.is_alive()
    reduce("CPU:1", b, out, "b")
    waiting.join()
    expected = tf.range(ELEMENTS, dtype=tf.int32) * 4
    result["a_right"] = bool(tf.reduce_all(out["a"] == expected))
    result["b_right"] = bool(tf.reduce_all(out["b"] == expected))


def main() -> None:
    a, b = two_participants()
    out: dict[str, tf.Tensor] = {}
    result = {"active_before": lms.get_statistics("CPU:0")["bytes_active"]}
    waiting = threading.Thread(target=reduce, args=("CPU:0", a, out, "a"))
    waiting.start()
    time.sleep(1.0)  # A's kernel has started and waits for B
    evictions = lms.get_statistics("CPU:0")["num_evictions"]
    result["active_while_waiting"] = lms.get_statistics("CPU:0")["bytes_active"]
    # Pressure while A waits: 12 tensors of 8 MiB made and read on a device
    # of 48 MiB, so whatever is not pinned is evicted.
    with tf.device("CPU:0"):
        pressure = [tf.fill([ELEMENTS], i) for i in range(12)]
        result["pressure_sum"] = int(tf.add_n([p[:1] for p in pressure])[0])
    stats = lms.get_statistics("CPU:0")
    result["evictions_while_waiting"] = stats["num_evictions"] - evictions
    result["active_under_pressure"] = stats["bytes_active"]
    finish(waiting, b, out, result)
    del pressure
    result["active_after"] = lms.get_statistics("CPU:0")["bytes_active"]
    result["unpinned_touches"] = len(lms.unpinned_touches())
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
