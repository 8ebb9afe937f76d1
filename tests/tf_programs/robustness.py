"""TensorFlow programs for the robustness tests; each prints ``RESULT <json>``.

Usage: python robustness.py NAME
  fork_child_writes     after fork(), the child fills the device (evicting and
                        reusing memory); the parent's tensors must stay intact
  fork_parent_writes    after fork(), the parent fills the device while the
                        child holds tensors; the child's must stay intact
  spawn                 multiprocessing with the spawn start method
  numpy_on_full_device  tf.constant of a 40 MiB NumPy array on a full device
  numpy_larger_than_device  tf.constant of a 200 MiB NumPy array on 64 MiB
  fit_large_numpy       model.fit with a 192 MiB NumPy x on a 64 MiB device
  fill_in_function      a 200 MiB tf.fill inside a tf.function on 64 MiB
  slices_larger_than_device  tf.data.Dataset.from_tensor_slices of a 60 MiB
                        NumPy array (argv[2] "numpy") or tf.constant of it
                        ("constant"), iterated in batches (run on 24 MiB)
  matmul_outputs_in_host_memory  tf.data batches and a matmul whose 16 MiB
                        output the device cannot hold (run on 16 MiB, strict)

Run with TF_LMS_CPU_DEVICE_MEMORY_MB=64 (and TF_LMS_ENABLED as the test says).
"""

from __future__ import annotations

import json
import os
import sys

MIB = 1 << 20


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def _tf():
    """Imports LMS and TensorFlow with one thread per pool.

    A fork() child has only the forking thread: TensorFlow's thread pools are
    gone there, so kernels must run inline (Eigen runs a one-thread pool's
    work on the caller).
    """
    import tensorflow_lms_allocator  # noqa: F401
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def _make(tf, count: int, mib: int, base: float) -> list:
    """`count` tensors of `mib` MiB, tensor i filled with base + i."""
    return [tf.fill((mib * MIB // 4,), base + i) for i in range(count)]


def _intact(tf, tensors: list, base: float) -> bool:
    """Whether tensor i still holds base + i everywhere."""
    return all(float(tf.reduce_min(t)) == base + i == float(tf.reduce_max(t))
               for i, t in enumerate(tensors))


def _read_line(fd: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def _fork(child_main) -> tuple[int, int, int]:
    """Forks; the child runs child_main(to_parent, from_parent) and exits.

    Returns (pid, from_child, to_child) in the parent.
    """
    c2p_r, c2p_w = os.pipe()
    p2c_r, p2c_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(c2p_r)
        os.close(p2c_w)
        code = 1
        try:
            child_main(c2p_w, p2c_r)
            code = 0
        except BaseException as error:  # report, never fall back into the parent's code
            os.write(c2p_w, (json.dumps({"child_error": repr(error)}) + "\n").encode())
        finally:
            os._exit(code)
    os.close(c2p_w)
    os.close(p2c_r)
    return pid, c2p_r, p2c_w


def fork_child_writes() -> None:
    """The parent holds 3 x 8 MiB; the child makes 7 x 8 MiB with LMS on (more
    than the device: it evicts the parent's tensors and reuses their device
    memory), 4 x 8 MiB with LMS off (the free memory), and checks them and the
    inherited tensors; then the parent checks its own and makes more."""
    tf = _tf()
    import tensorflow_lms_allocator as lms

    parent = _make(tf, 3, 8, 1.0)
    count = 7 if lms.get_lms_enabled() else 4

    def child(to_parent: int, _from_parent: int) -> None:
        mine = _make(tf, count, 8, 100.0)
        result = {"child_own_ok": _intact(tf, mine, 100.0),
                  "child_inherited_ok": _intact(tf, parent, 1.0),
                  "child_evictions": lms.get_statistics(0)["num_evictions"]}
        os.write(to_parent, (json.dumps(result) + "\n").encode())

    pid, from_child, to_child = _fork(child)
    child_result = json.loads(_read_line(from_child) or "{}")
    _, status = os.waitpid(pid, 0)
    more = _make(tf, 2, 8, 50.0)  # the parent keeps using the device afterwards
    emit({**child_result, "child_exit": status,
          "parent_ok": _intact(tf, parent, 1.0), "parent_new_ok": _intact(tf, more, 50.0)})


def fork_parent_writes() -> None:
    """The child makes 3 x 8 MiB and waits; the parent then makes 7 x 8 MiB
    and writes them; the child checks its tensors, then the parent its own."""
    tf = _tf()

    inherited = _make(tf, 2, 8, 1.0)

    def child(to_parent: int, from_parent: int) -> None:
        mine = _make(tf, 3, 8, 200.0)
        before = _intact(tf, mine, 200.0)
        os.write(to_parent, b"ready\n")
        _read_line(from_parent)  # the parent has written its tensors
        result = {"child_before_ok": before, "child_own_ok": _intact(tf, mine, 200.0),
                  "child_inherited_ok": _intact(tf, inherited, 1.0)}
        os.write(to_parent, (json.dumps(result) + "\n").encode())

    pid, from_child, to_child = _fork(child)
    ready = _read_line(from_child)
    parent = _make(tf, 5, 8, 300.0)
    parent_ok = _intact(tf, parent, 300.0)
    os.write(to_child, b"go\n")
    child_result = json.loads(_read_line(from_child) or "{}")
    _, status = os.waitpid(pid, 0)
    emit({**child_result, "ready": ready, "child_exit": status, "parent_ok": parent_ok,
          "parent_inherited_ok": _intact(tf, inherited, 1.0)})


def _spawn_worker(queue) -> None:
    tf = _tf()
    import tensorflow_lms_allocator as lms

    tensors = _make(tf, 4, 8, 5.0)
    queue.put({"ok": _intact(tf, tensors, 5.0),
               "bytes_limit": lms.get_statistics(0)["bytes_limit"]})


def spawn() -> None:
    """A spawned child imports LMS afresh and gets a device of its own."""
    import multiprocessing as mp

    tf = _tf()
    parent = _make(tf, 3, 8, 1.0)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_spawn_worker, args=(queue,))
    proc.start()
    child = queue.get(timeout=240)
    proc.join(timeout=60)
    emit({"child": child, "child_exit": proc.exitcode, "parent_ok": _intact(tf, parent, 1.0)})


def numpy_on_full_device() -> None:
    """Fills the device, then converts a 40 MiB NumPy array (not 64-byte
    aligned, so TensorFlow copies it through the device's allocator)."""
    import numpy as np

    tf = _tf()
    import tensorflow_lms_allocator as lms

    result: dict = {"error": None}
    kept = _make(tf, 7, 8, 1.0)  # 56 of 64 MiB
    raw = np.arange(10 * MIB + 1, dtype=np.float32)
    array = raw[1:]  # 40 MiB at a 4-byte offset: TF_NewTensor copies it
    result["aligned"] = array.ctypes.data % 64 == 0
    try:
        tensor = tf.constant(array)
        result["value_ok"] = bool(np.array_equal(tensor.numpy(), array))
        result["sum_ok"] = float(tf.reduce_sum(tensor[:1000])) == float(array[:1000].sum())
        # A kernel's output still has to fit on the device.
        try:
            doubled = tensor * 2.0
            result["kernel_output"] = float(doubled[1])
        except tf.errors.ResourceExhaustedError as error:
            result["kernel_error"] = {"type": type(error).__name__,
                                      "message": str(error)[:2000]}
    except Exception as error:  # noqa: BLE001  (the test reads type and message)
        result["error"] = {"type": type(error).__name__, "message": str(error)[:2000]}
    result["kept_ok"] = _intact(tf, kept, 1.0)
    # Host-memory buffers go back when their tensors die: 10 more conversions
    # of 40 MiB leave the resident set about where it was.
    tensor = doubled = None  # noqa: F841
    before = _resident_bytes()
    for _ in range(10):
        converted = tf.constant(array)
        del converted
    result["resident_growth_mib"] = (_resident_bytes() - before) / MIB
    result["stats"] = lms.get_statistics(0)
    emit(result)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def numpy_larger_than_device() -> None:
    """tf.constant of an unaligned 200 MiB NumPy array on a 64 MiB device."""
    import numpy as np

    tf = _tf()

    result: dict = {"error": None}
    array = np.arange(50 * MIB + 1, dtype=np.float32)[1:]  # 200 MiB, 4-byte offset
    result["aligned"] = array.ctypes.data % 64 == 0
    try:
        tensor = tf.constant(array)
        result["value_ok"] = bool(np.array_equal(tensor.numpy(), array))
        result["slice_sum"] = float(tf.reduce_sum(tensor[-1000:]))
        result["expected_sum"] = float(array[-1000:].sum())
    except Exception as error:  # noqa: BLE001
        result["error"] = {"type": type(error).__name__, "message": str(error)[:2000]}
    emit(result)


def fit_large_numpy() -> None:
    """model.fit with a 192 MiB NumPy x (48 M floats) on a 64 MiB device."""
    import numpy as np

    tf = _tf()
    import keras

    rows, width = 48 * 1024, 1024  # 192 MiB of float32
    rng = np.random.default_rng(0)
    # At a 4-byte offset, so TensorFlow copies it through the allocator.
    x = np.empty(rows * width + 1, dtype=np.float32)[1:].reshape(rows, width)
    x[:] = rng.random((rows, width), dtype=np.float32)
    y = (x[:, :1] > 0.5).astype(np.float32)
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    result: dict = {"error": None}
    try:
        history = model.fit(x, y, batch_size=256, epochs=1, steps_per_epoch=20, verbose=0)
        result["loss"] = float(history.history["loss"][-1])
        result["aligned"] = x.ctypes.data % 64 == 0
    except Exception as error:  # noqa: BLE001
        result["error"] = {"type": type(error).__name__, "message": str(error)[:2000]}
    emit(result)


def slices_larger_than_device() -> None:
    import numpy as np

    tf = _tf()
    import tensorflow_lms_allocator as lms

    x = np.arange(15 * MIB, dtype=np.float32).reshape(-1, 1024)  # 60 MiB
    source = x if sys.argv[2] == "numpy" else tf.constant(x)
    rows = first_column = 0.0
    for batch in tf.data.Dataset.from_tensor_slices(source).batch(1024):
        rows += int(batch.shape[0])
        first_column += float(tf.reduce_sum(tf.cast(batch[:, 0], tf.float64)))
    emit({"rows": rows, "first_column_ok": first_column == float(x[:, 0].sum(dtype=np.float64)),
          "stats": lms.get_statistics(0)})


def fill_in_function() -> None:
    """A 200 MiB tf.fill inside a tf.function on a 64 MiB device, returned
    (Grappler makes it a 200 MiB Const node, parsed when its kernel is
    created) and multiplied by an argument (as the issue reported it)."""
    tf = _tf()

    @tf.function
    def returned():
        return tf.fill((50 * MIB,), 1.0)

    @tf.function
    def multiplied(x):
        return tf.reduce_sum(tf.fill((50 * MIB,), 1.0) * x)

    result: dict = {}
    for name, call in [("returned", lambda: float(returned()[-1])),
                       ("multiplied", lambda: float(multiplied(tf.constant(2.0))))]:
        try:
            result[name] = {"value": call(), "error": None}
        except Exception as error:  # noqa: BLE001
            result[name] = {"error": {"type": type(error).__name__,
                                      "message": str(error)[-3000:]}}
    result["after"] = float(tf.reduce_sum(tf.fill((MIB,), 1.0)))  # the device still works
    emit(result)


def matmul_outputs_in_host_memory() -> None:
    """A map -> batch -> prefetch pipeline of 1.5 MiB batches, 2 MiB
    temporaries, and a matmul with a constant whose 16 MiB output the 16 MiB
    device cannot hold while its inputs are pinned: placed in host memory for
    the kernel (AllocateInHostMemory). In strict mode this died in free()
    ("corrupted size vs. prev_size") before Note [Strict mode's own signal
    stack], and reported MatMul writing its own output."""
    import numpy as np

    tf = _tf()
    import tensorflow_lms_allocator as lms

    values = 96 * 1024  # an element of 384 KiB, a batch of 1.5 MiB

    def element(i):
        return tf.cast(i, tf.float32) + tf.range(values, dtype=tf.float32)

    w = tf.constant(np.random.RandomState(0).rand(96, 1024).astype(np.float32))
    total = 0.0
    for b, batch in enumerate(tf.data.Dataset.range(160).map(element).batch(4).prefetch(6)):
        temporaries = [tf.fill((512 * 1024,), float(b + k)) for k in range(2)]
        product = tf.matmul(tf.reshape(batch, (-1, 96)), w)
        total += float(tf.reduce_sum(batch) + tf.reduce_sum(product) +
                       sum(tf.reduce_sum(t) for t in temporaries))
    emit({"total": total, "stats": lms.get_statistics(0),
          "touched_by": sorted({t.op for t in lms.unpinned_touches()})})


if __name__ == "__main__":
    {"slices_larger_than_device": slices_larger_than_device,
     "fork_child_writes": fork_child_writes, "fork_parent_writes": fork_parent_writes,
     "spawn": spawn, "numpy_on_full_device": numpy_on_full_device,
     "fit_large_numpy": fit_large_numpy, "numpy_larger_than_device": numpy_larger_than_device,
     "fill_in_function": fill_in_function,
     "matmul_outputs_in_host_memory": matmul_outputs_in_host_memory}[sys.argv[1]]()
