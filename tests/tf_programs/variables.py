"""Kernels that reach evicted tf.Variables through their resource handles.

Usage: python variables.py CASE [CASE ...]    (or `all`, or `train`)

Each case creates variables of 4 MiB (two granules: evictable), evicts them by
filling the emulated device with other tensors, runs one kind of variable op
with strict mode's report cleared, and records:
  evicted   whether each variable's buffer was evicted just before the op
  touches   strict mode's unpinned touches during the op
  ok        the values after the op equal a NumPy reference
Strict mode's report is read right after the op, before any value is read back
(EagerTensor.numpy() reads outside a kernel, so it is not part of what a case
tests). Prints one line ``RESULT {"cases": {name: {...}}}``.

Run with TF_LMS_CPU_DEVICE_MEMORY_MB=64 TF_LMS_ENABLED=1 TF_LMS_STRICT=1.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import traceback

import tensorflow_lms_allocator as lms  # before tensorflow
from tensorflow_lms_allocator.overlay import activation

import numpy as np
import tensorflow as tf

MIB = 1 << 20
N = MIB  # float32 elements: 4 MiB per variable
DEVICE_MIB = 64


def address_of(variable: tf.Variable) -> int:
    """The first byte of the variable's buffer. ReadVariableOp's output
    aliases the buffer (copy-on-write mode) and DLPack exports it without a
    copy (EagerTensor.numpy() copies); both are dropped before this returns,
    so the variable's buffer has one reference again."""
    capsule = tf.experimental.dlpack.to_dlpack(variable.read_value())
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    managed = get(capsule, b"dltensor")  # DLManagedTensor*: DLTensor.data first
    return ctypes.c_void_p.from_address(managed).value


def inspect(address: int) -> dict | None:
    """The engine's view of the live allocation containing `address`."""
    out = (ctypes.c_int64 * 5)()
    lib = activation.adapter()
    if lib.tf_lms_inspect(address, out) != 0:
        return None
    return {"id": out[0], "address": out[1], "requested_bytes": out[2],
            "evicted": bool(out[3]), "pin_count": out[4]}


def evict(addresses: list[int]) -> None:
    """Creates new tensors until the allocations at `addresses` are evicted
    (least recently used first, under TF_LMS_POLICY=lru, which
    tests/test_tf_variables.py sets, so older leftovers of earlier cases may go
    first), then frees them: the op under test finds free device memory to
    page its inputs back in. Gives up after twice the device's size."""
    fillers = []
    # As large as the variables: the policy's single reclaim takes the least
    # recently used allocation that alone frees enough, so it reaches them.
    for i in range(2 * DEVICE_MIB * MIB // (4 * N)):
        if all((inspect(a) or {}).get("evicted") for a in addresses):
            break
        fillers.append(tf.fill((N,), float(i)))
    del fillers


def run_op(variables: list[tf.Variable], op) -> dict:
    """Evicts everything, runs `op` and returns what the case records."""
    addresses = [address_of(v) for v in variables]
    evict(addresses)
    infos = [inspect(a) for a in addresses]
    page_ins = lms.get_statistics(0)["num_page_ins"]
    lms.clear_unpinned_touches()
    result = op()
    touches = [t.__dict__ for t in lms.unpinned_touches()]
    return {"evicted": [bool(i and i["evicted"] and i["requested_bytes"] == 4 * N)
                        for i in infos],
            "touches": touches,
            "page_ins": lms.get_statistics(0)["num_page_ins"] - page_ins,
            "result": result}


def initial(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


def on_device(array: np.ndarray) -> tf.Tensor:
    """`array` as a kernel's output, which is always memory from the LMS
    device's allocator. The buffer of tf.constant(array), and of a variable
    initialised from it, is not always (in one run 6 of 12 had an address no
    LMS allocation contains): such a variable is never evicted. (x * 1 is
    exact.)"""
    return tf.constant(array) * tf.constant(1, dtype=array.dtype)


def same(actual, expected, atol: float = 1e-6) -> bool:
    return bool(np.allclose(np.asarray(actual), expected, rtol=1e-5, atol=atol))


# --- the cases -------------------------------------------------------------

def case_control() -> dict:
    """Not an op: an alias of the variable's buffer read by .numpy() outside
    any kernel after eviction. Strict mode must report it (it shows that the
    variable's evicted memory is watched)."""
    v = tf.Variable(on_device(initial(1)))
    alias = v.read_value()
    out = run_op([v], lambda: alias.numpy().copy())
    out["ok"] = same(out.pop("result"), initial(1))
    out["expect_touches"] = True
    return out


def case_read() -> dict:
    v = tf.Variable(on_device(initial(1)))
    out = run_op([v], v.read_value)  # ReadVariableOp
    out["ok"] = same(out.pop("result"), initial(1))
    return out


def case_assign() -> dict:
    v = tf.Variable(on_device(initial(1)))
    new = on_device(initial(2))
    out = run_op([v], lambda: v.assign(new, read_value=False))  # AssignVariableOp
    out.pop("result")
    out["ok"] = same(v.numpy(), initial(2))
    return out


def case_assign_add() -> dict:
    v = tf.Variable(on_device(initial(1)))
    delta = on_device(initial(2))
    out = run_op([v], lambda: v.assign_add(delta, read_value=False))  # AssignAddVariableOp
    out.pop("result")
    out["ok"] = same(v.numpy(), initial(1) + initial(2))
    return out


def case_assign_sub() -> dict:
    v = tf.Variable(on_device(initial(1)))
    delta = on_device(initial(2))
    out = run_op([v], lambda: v.assign_sub(delta, read_value=False))  # AssignSubVariableOp
    out.pop("result")
    out["ok"] = same(v.numpy(), initial(1) - initial(2))
    return out


def case_assign_add_copy_on_write() -> dict:
    """With another reference to the buffer (`alias`), the update copies the
    variable into a new buffer, allocated inside the kernel, and adds there;
    the old buffer keeps the old values."""
    v = tf.Variable(on_device(initial(1)))
    alias = v.read_value()
    delta = on_device(initial(2))
    before = address_of(v)
    out = run_op([v], lambda: v.assign_add(delta, read_value=False))
    out.pop("result")
    out["replaced"] = address_of(v) != before
    out["ok"] = (same(v.numpy(), initial(1) + initial(2)) and
                 same(alias.numpy(), initial(1)) and out["replaced"])
    return out


def sparse_indices() -> np.ndarray:
    # Spread over the whole buffer, so every granule of it is written.
    return np.unique(np.random.default_rng(7).integers(0, N, 4096)).astype(np.int32)


def case_scatter_add() -> dict:
    v = tf.Variable(on_device(initial(1)))
    idx = sparse_indices()
    vals = np.arange(len(idx), dtype=np.float32)
    slices = tf.IndexedSlices(tf.constant(vals), tf.constant(idx))
    out = run_op([v], lambda: v.scatter_add(slices))  # ResourceScatterAdd
    out.pop("result")
    expected = initial(1)
    np.add.at(expected, idx, vals)
    out["ok"] = same(v.numpy(), expected)
    return out


def case_scatter_update() -> dict:
    v = tf.Variable(on_device(initial(1)))
    idx = sparse_indices()
    vals = -np.arange(len(idx), dtype=np.float32)
    slices = tf.IndexedSlices(tf.constant(vals), tf.constant(idx))
    out = run_op([v], lambda: v.scatter_update(slices))  # ResourceScatterUpdate
    out.pop("result")
    expected = initial(1)
    expected[idx] = vals
    out["ok"] = same(v.numpy(), expected)
    return out


def case_gather() -> dict:
    v = tf.Variable(on_device(initial(1)))
    idx = tf.constant(sparse_indices())
    out = run_op([v], lambda: tf.gather(v, idx))  # ResourceGather
    out["ok"] = same(out.pop("result"), initial(1)[sparse_indices()])
    return out


def case_sparse_read() -> dict:
    v = tf.Variable(on_device(initial(1)))
    idx = tf.constant(sparse_indices())
    out = run_op([v], lambda: v.sparse_read(idx))  # ResourceGather
    out["ok"] = same(out.pop("result"), initial(1)[sparse_indices()])
    return out


def case_apply_momentum() -> dict:
    var, accum = tf.Variable(on_device(initial(1))), tf.Variable(on_device(initial(3)))
    grad = on_device(initial(2))
    lr, momentum = 0.1, 0.9
    out = run_op([var, accum], lambda: tf.raw_ops.ResourceApplyMomentum(
        var=var.handle, accum=accum.handle, lr=lr, grad=grad, momentum=momentum))
    out.pop("result")
    expected_accum = initial(3) * momentum + initial(2)
    out["ok"] = (same(accum.numpy(), expected_accum) and
                 same(var.numpy(), initial(1) - lr * expected_accum))
    return out


def case_sparse_apply_momentum() -> dict:
    """The sparse optimizer update of an embedding table (rows `idx` only)."""
    var, accum = tf.Variable(on_device(initial(1))), tf.Variable(on_device(initial(3)))
    idx = sparse_indices()
    grad = np.linspace(-1, 1, len(idx)).astype(np.float32)
    lr, momentum = 0.1, 0.9
    out = run_op([var, accum], lambda: tf.raw_ops.ResourceSparseApplyMomentum(
        var=var.handle, accum=accum.handle, lr=lr, grad=tf.constant(grad),
        indices=tf.constant(idx), momentum=momentum))
    out.pop("result")
    expected_accum, expected_var = initial(3), initial(1)
    expected_accum[idx] = expected_accum[idx] * momentum + grad
    expected_var[idx] -= lr * expected_accum[idx]
    out["ok"] = same(accum.numpy(), expected_accum) and same(var.numpy(), expected_var)
    return out


def case_apply_adam() -> dict:
    var, m = tf.Variable(on_device(initial(1))), tf.Variable(on_device(initial(3)))
    v = tf.Variable(on_device(np.abs(initial(4))))
    grad = on_device(initial(2))
    lr, b1, b2, eps, b1p, b2p = 0.01, 0.9, 0.999, 1e-7, 0.9, 0.999
    out = run_op([var, m, v], lambda: tf.raw_ops.ResourceApplyAdam(
        var=var.handle, m=m.handle, v=v.handle, beta1_power=b1p, beta2_power=b2p, lr=lr,
        beta1=b1, beta2=b2, epsilon=eps, grad=grad))
    out.pop("result")
    g = initial(2).astype(np.float64)
    em = initial(3) + (g - initial(3)) * (1 - b1)
    ev = np.abs(initial(4)) + (g * g - np.abs(initial(4))) * (1 - b2)
    lr_t = lr * np.sqrt(1 - b2p) / (1 - b1p)
    evar = initial(1) - lr_t * em / (np.sqrt(ev) + eps)
    # float32 in TensorFlow against float64 here: m / sqrt(v) amplifies rounding.
    out["ok"] = (same(m.numpy(), em) and same(v.numpy(), ev) and
                 same(var.numpy(), evar, atol=1e-4))
    return out


def case_scatter_add_aliased() -> dict:
    """A sparse update switches the variable to copy-on-read mode; with
    another reference to its buffer that copies it into a new buffer first."""
    v = tf.Variable(on_device(initial(1)))
    alias = v.read_value()
    idx = sparse_indices()
    vals = np.arange(len(idx), dtype=np.float32)
    slices = tf.IndexedSlices(tf.constant(vals), tf.constant(idx))
    out = run_op([v], lambda: v.scatter_add(slices))
    out.pop("result")
    expected = initial(1)
    np.add.at(expected, idx, vals)
    out["ok"] = same(v.numpy(), expected) and same(alias.numpy(), initial(1))
    return out


def case_tf_function() -> dict:
    """The same kernels inside a tf.function run by the graph executor: a
    gather, an update and a read of captured (evicted) variables."""
    v, w = tf.Variable(on_device(initial(1))), tf.Variable(on_device(initial(3)))
    idx = tf.constant(sparse_indices())
    delta = on_device(initial(2))

    @tf.function
    def step():
        g = tf.gather(v, idx)
        w.assign_sub(delta)
        return g, tf.reduce_sum(w.read_value())

    step.get_concrete_function()  # trace before evicting
    out = run_op([v, w], step)
    gathered, total = out.pop("result")
    out["ok"] = (same(gathered, initial(1)[sparse_indices()]) and
                 same(w.numpy(), initial(3) - initial(2)) and
                 bool(np.isclose(float(total), float(np.sum(initial(3) - initial(2))),
                                 rtol=1e-3)))
    return out


def case_xla() -> dict:
    """tf.function(jit_compile=True) runs as one XLA kernel named after the
    function; it reads and updates the variables it captures."""
    v = tf.Variable(on_device(initial(1)))
    delta = on_device(initial(2))

    @tf.function(jit_compile=True)
    def step():
        v.assign_add(delta)
        return tf.reduce_sum(v)

    step.get_concrete_function()
    out = run_op([v], step)
    total = float(out.pop("result"))
    expected = initial(1) + initial(2)
    out["ok"] = (same(v.numpy(), expected) and
                 bool(np.isclose(total, float(np.sum(expected.astype(np.float64))),
                                 rtol=1e-3, atol=1e-2)))
    return out


def case_session() -> dict:
    """tf.compat.v1 graph and Session: variable handles are names in the
    device's ResourceMgr (not reference-counting handles)."""
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", initializer=initial(1), use_resource=True)
        # Variables created after `v` fill the device and evict it.
        fillers = [tf.compat.v1.get_variable(f"f{i}", shape=(N,),
                                             initializer=tf.compat.v1.ones_initializer(),
                                             use_resource=True)
                   for i in range(DEVICE_MIB * MIB // (4 * N))]
        idx = tf.constant(sparse_indices())
        gather = tf.gather(v, idx)
        update = v.assign_add(tf.ones((N,)), read_value=False)
        init_v = v.initializer
        init_fillers = [f.initializer for f in fillers]
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init_v)
        sess.run(init_fillers)
        evicted = lms.get_statistics(0)["current_bytes_reclaimed"] >= 4 * N
        page_ins = lms.get_statistics(0)["num_page_ins"]
        lms.clear_unpinned_touches()
        gathered = sess.run(gather)
        sess.run(update)
        touches = [t.__dict__ for t in lms.unpinned_touches()]
        page_ins = lms.get_statistics(0)["num_page_ins"] - page_ins
        value = sess.run(v)
    # The variable's address is not reachable from a Session: eviction is
    # shown by the bytes evicted and the page-in the kernels made.
    return {"evicted": [evicted], "touches": touches, "page_ins": page_ins,
            "ok": (same(gathered, initial(1)[sparse_indices()]) and
                   same(value, initial(1) + 1))}


def keras_step(optimizer_factory, reference) -> dict:
    """One Keras optimizer step on an evicted variable with evicted slots."""
    import keras

    var = keras.Variable(on_device(initial(1)))
    optimizer = optimizer_factory()
    optimizer.build([var])
    grad = on_device(initial(2))
    big_slots = [s.value for s in optimizer.variables if tuple(s.shape) == (N,)]
    out = run_op([var.value, *big_slots],
                 lambda: optimizer.apply_gradients([(grad, var)]))
    out.pop("result")
    out["slots"] = len(big_slots)
    out["ok"] = same(var.numpy(), reference(initial(1).astype(np.float64),
                                            initial(2).astype(np.float64)))
    return out


def case_keras_sgd_momentum() -> dict:
    import keras

    lr, momentum = 0.1, 0.9

    def reference(w, g):
        m = momentum * 0.0 - lr * g
        return w + m

    return keras_step(lambda: keras.optimizers.SGD(learning_rate=lr, momentum=momentum),
                      reference)


def case_keras_adam() -> dict:
    import keras

    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-7

    def reference(w, g):
        m = (g - 0.0) * (1 - b1)
        v = (g * g - 0.0) * (1 - b2)
        alpha = lr * np.sqrt(1 - b2) / (1 - b1)
        return w - alpha * m / (np.sqrt(v) + eps)

    return keras_step(lambda: keras.optimizers.Adam(learning_rate=lr, beta_1=b1, beta_2=b2,
                                                    epsilon=eps), reference)


def train(steps: int = 4) -> dict:
    """Keras training whose weights and Adam slots (4 MiB each, 72 MiB in
    all) do not fit the 64 MiB device beside each other: between uses they
    are evicted, and each step's kernels page them back in. Single-threaded,
    so the losses can be compared bit for bit with an uncapped run."""
    import keras

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras.utils.set_random_seed(0)
    width, layers, batch = 1024, 6, 32
    model = keras.Sequential([keras.Input((width,))] +
                             [keras.layers.Dense(width, activation="tanh")
                              for _ in range(layers)] + [keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * steps, width)).astype(np.float32)
    y = rng.standard_normal((batch * steps, 1)).astype(np.float32)
    losses = []
    lms.clear_unpinned_touches()
    for i in range(steps):
        losses.append(float(model.train_on_batch(x[i * batch:(i + 1) * batch],
                                                 y[i * batch:(i + 1) * batch])))
    capped = "TF_LMS_CPU_DEVICE_MEMORY_MB" in os.environ  # else stock allocation
    return {"losses": losses, "touches": [t.__dict__ for t in lms.unpinned_touches()],
            "stats": lms.get_statistics(0) if capped else None}


CASES = {name[len("case_"):]: fn for name, fn in sorted(globals().items())
         if name.startswith("case_")}


def main(names: list[str]) -> None:
    if names == ["train"]:
        print("RESULT " + json.dumps(train()), flush=True)
        return
    if names == ["all"]:
        names = list(CASES)
    results = {}
    for name in names:
        try:
            results[name] = CASES[name]()
        except Exception:  # reported per case; the test prints it
            results[name] = {"error": traceback.format_exc()}
    stats = lms.get_statistics(0)
    print("RESULT " + json.dumps({"cases": results, "num_evictions": stats["num_evictions"],
                                  "bytes_limit": stats["bytes_limit"]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
