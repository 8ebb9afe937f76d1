"""A kernel that cannot fit while a collective waits for its peer does not wait it out.

Two logical CPU devices of one emulated device (48 MiB); participant A's
CollectiveReduceV2 (an AsyncOpKernel, like NcclAllReduce on a GPU) starts on
a thread and waits for participant B, holding its input and output pinned
(16 MiB). The main thread then runs a kernel whose output (40 MiB) cannot be
resident beside them: nothing but A holds memory, and A releases only when B
comes, which the main thread brings after. The kernel's request is served in
host memory (Note [Asynchronous kernels wait for others] in kernel_pins.h)
instead of waiting the 10 s retry budget and failing. Prints one line
``RESULT <json>``: how long the kernel took, whether its result and both
collectives' are right, whether A was still waiting, and the LMS statistics.

Usage: python collective_pressure.py   (the environment decides the allocator)
"""

from __future__ import annotations

import json
import threading
import time

from collectives import finish, reduce, two_participants  # imports the overlay first
import tensorflow_lms_allocator as lms
import tensorflow as tf

LARGE = 10 << 20  # 40 MiB of int32


def main() -> None:
    a, b = two_participants()
    out: dict[str, tf.Tensor] = {}
    waiting = threading.Thread(target=reduce, args=("CPU:0", a, out, "a"))
    waiting.start()
    time.sleep(1.0)  # A's kernel has started and waits for B
    result = {"active_while_waiting": lms.get_statistics("CPU:0")["bytes_active"]}
    start = time.monotonic()
    error = None
    with tf.device("CPU:0"):
        try:
            large = tf.fill([LARGE], 2)
            result["large_right"] = int(tf.reduce_sum(large[-4:])) == 8
        except tf.errors.ResourceExhaustedError as e:
            error = str(e).splitlines()[0]
    result["seconds"] = time.monotonic() - start
    result["error"] = error
    finish(waiting, b, out, result)
    result["stats"] = lms.get_statistics("CPU:0")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
