"""Kernel contexts that nest on one thread or end on another (Note [Kernel
context lifetime] in kernel_pins.h); each case prints ``RESULT <json>``.

Usage: python kernel_contexts.py CASE
  nested_oom           an eager op inside tf.py_function needs memory that only
                       the end of the py_function's own kernel would free: the
                       only kernels running are its own thread's, so it fails
                       at once instead of waiting for them
  nested_oom_function  the same inside a tf.function (graph executor thread)
  cross_thread         a dequeue blocks in a tf.function until another thread
                       enqueues: the dequeue's context is destroyed on the
                       enqueuing thread; its creator (the one inter-op thread)
                       must not keep it as a live context of its own

Run with TF_LMS_CPU_DEVICE_MEMORY_MB=64 TF_LMS_ENABLED=1.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time

import tensorflow_lms_allocator as lms  # before tensorflow
from tensorflow_lms_allocator.overlay import activation

import tensorflow as tf

MIB = 1 << 20


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def kernel_contexts() -> dict:
    """Live kernel contexts in the process, and those the calling thread created."""
    out = (ctypes.c_int64 * 2)()
    lib = activation.adapter()
    assert lib.tf_lms_kernel_contexts(out) == 0, "no LMS device"
    return {"live": out[0], "thread": out[1], "thread_id": threading.get_ident()}


def nested(in_function: bool) -> None:
    """tf.py_function's kernel pins its 40 MiB input and runs `body` on its
    own thread; there an eager op asks for 40 MiB more of the 64 MiB device.
    That fits only once the py_function's kernel ends, which it cannot before
    `body` returns: the op must not wait for it. With LMS on it is placed in
    host memory at once (born evicted), or fails at once if host memory for
    evicted tensors cannot hold it either."""
    big = tf.fill((10 * MIB,), 2.0)  # 40 MiB
    seen = {}

    def body(pinned):
        seen["inside"] = kernel_contexts()
        start = time.monotonic()
        born_evicted = lms.get_statistics(0)["num_overflow_placements"]
        try:
            seen["inner_min"] = float(tf.reduce_min(tf.fill((10 * MIB,), 1.0)))
            seen["error"] = None
            seen["placed_in_host_memory"] = (
                lms.get_statistics(0)["num_overflow_placements"] - born_evicted)
        except tf.errors.ResourceExhaustedError as error:
            seen["error"] = type(error).__name__
        seen["seconds"] = time.monotonic() - start
        return tf.reduce_sum(pinned)

    call = lambda: tf.py_function(body, [big], tf.float32)  # noqa: E731
    if in_function:
        call = tf.function(call)
    seen["sum"] = float(call())
    # The process keeps working after the failure (the tf.function still
    # holds `big`: 8 MiB fit beside it without evicting it).
    del big
    seen["after"] = float(tf.reduce_sum(tf.fill((2 * MIB,), 1.0)))
    seen["contexts_after"] = kernel_contexts()
    emit(seen)


def cross_thread() -> None:
    # One inter-op thread: the function's kernels (the dequeue and the
    # py_functions around it) run on that one pool thread.
    tf.config.threading.set_inter_op_parallelism_threads(1)
    queue = tf.queue.FIFOQueue(4, tf.float32, shapes=[()])
    seen = {}

    def report(key):
        def body():
            seen[key] = kernel_contexts()
            return 0.0
        return body

    @tf.function
    def dequeue():
        before = tf.py_function(report("before"), [], tf.float32)
        with tf.control_dependencies([before]):
            x = queue.dequeue()  # blocks: its done callback runs on the enqueuer
        with tf.control_dependencies([x]):
            after = tf.py_function(report("after"), [], tf.float32)
        return x + after

    def enqueue():
        time.sleep(1.0)  # the dequeue is blocked by now
        seen["enqueuer"] = threading.get_ident()
        queue.enqueue(1.0)

    enqueuer = threading.Thread(target=enqueue)
    enqueuer.start()
    seen["value"] = float(dequeue())
    # The enqueue kernel ran the dequeue's done callback, which destroyed the
    # dequeue's context, before returning.
    enqueuer.join()

    @tf.function
    def probe():
        return tf.py_function(report("probe"), [], tf.float32)

    probe()  # on the pool thread that created the dequeue's context
    seen["main_after"] = kernel_contexts()
    emit(seen)


if __name__ == "__main__":
    {"nested_oom": lambda: nested(False), "nested_oom_function": lambda: nested(True),
     "cross_thread": cross_thread}[sys.argv[1]]()
