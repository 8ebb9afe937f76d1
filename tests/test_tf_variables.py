"""Kernels that reach tf.Variables through resource handles pin the variables'
buffers (Note [Variables reached through handles] in kernel_pins.h).

Each case of tests/tf_programs/variables.py evicts 4 MiB variables on a 64 MiB
emulated device in strict mode, runs one kind of variable op, and checks the
values against NumPy. A pinned kernel pages the variable in first, so strict
mode reports no touch of evicted memory; before variables were pinned, every
case that reads or updates data in place reported one. All cases run in one
process (one TensorFlow start-up, a few seconds).
"""

from __future__ import annotations

import pytest

from tf_helpers import describe, run_program

pytestmark = [pytest.mark.tensorflow, pytest.mark.gpu_wheel]

# LRU: the program evicts each case's variables by allocating until they are
# evicted, which reaches them least recently used first; the learned policy,
# having seen earlier cases, may keep them and evict the fillers instead.
STRICT_DEVICE = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1",
                 "TF_LMS_STRICT": "1", "TF_LMS_POLICY": "lru"}

# Case -> the op it runs on evicted variables.
OPS = {
    "read": "ReadVariableOp",
    "assign": "AssignVariableOp",
    "assign_add": "AssignAddVariableOp",
    "assign_sub": "AssignSubVariableOp",
    "assign_add_copy_on_write": "AssignAddVariableOp copying a shared buffer",
    "scatter_add": "ResourceScatterAdd",
    "scatter_add_aliased": "ResourceScatterAdd switching to copy-on-read",
    "scatter_update": "ResourceScatterUpdate",
    "gather": "ResourceGather (tf.gather)",
    "sparse_read": "ResourceGather (sparse_read)",
    "apply_momentum": "ResourceApplyMomentum",
    "apply_adam": "ResourceApplyAdam",
    "sparse_apply_momentum": "ResourceSparseApplyMomentum",
    "keras_sgd_momentum": "a Keras SGD step with momentum",
    "keras_adam": "a Keras Adam step",
    "tf_function": "a gather, an update and a read in a tf.function",
    "session": "a gather and an update in a tf.compat.v1 Session",
    "xla": "an update and a read in a tf.function(jit_compile=True)",
}


@pytest.fixture(scope="module")
def cases() -> dict[str, dict]:
    run = run_program("variables.py", "all", env=STRICT_DEVICE)
    assert run.returncode == 0 and run.result, describe(run)
    assert run.result["bytes_limit"] == 64 << 20
    return run.result["cases"]


@pytest.mark.parametrize("case", list(OPS))
def test_op_on_evicted_variables_pages_them_in_with_no_unpinned_touch(cases, case):
    out = cases[case]
    assert "error" not in out, out.get("error")
    assert out["evicted"] and all(out["evicted"]), f"{OPS[case]}: not evicted: {out}"
    assert out["page_ins"] >= 1, f"{OPS[case]}: nothing was paged in"
    assert out["touches"] == [], f"{OPS[case]} touched evicted memory unpinned"
    assert out["ok"], f"{OPS[case]}: values differ from the NumPy reference"


def test_keras_optimizer_slots_are_evicted_and_pinned_too(cases):
    assert cases["keras_sgd_momentum"]["slots"] == 1  # momentum
    assert cases["keras_adam"]["slots"] == 2  # first and second moments
    assert cases["keras_adam"]["page_ins"] >= 3  # the variable and both slots


def test_copy_on_write_update_moves_the_variable_to_a_buffer_allocated_in_the_kernel(cases):
    """The new buffer is allocated inside the kernel, so it starts pinned."""
    out = cases["assign_add_copy_on_write"]
    assert out["replaced"] and out["ok"] and out["touches"] == []


def test_strict_mode_reports_a_read_of_an_evicted_variable_outside_any_kernel(cases):
    """Control: the variables' evicted memory is watched. An alias of the
    variable's buffer read by .numpy() after eviction goes through no kernel,
    and strict mode reports it (with no op); the bytes read are still right."""
    out = cases["control"]
    assert out["evicted"] == [True]
    assert out["touches"], "the unpinned read was not reported"
    assert {t["allocation_bytes"] for t in out["touches"]} == {4 << 20}
    assert {t["op"] for t in out["touches"]} == {"-"}
    assert out["ok"]


def test_keras_training_with_evicted_weights_and_slots_matches_stock_with_no_unpinned_touch():
    """Six 4 MiB Dense kernels with Adam's two slots each (72 MiB of variables)
    train on a 64 MiB device: weights and slots are evicted between uses and
    paged back in by the kernels that read and update them."""
    stock = run_program("variables.py", "train")  # uncapped, TensorFlow's allocator
    assert stock.returncode == 0 and stock.result, describe(stock)
    run = run_program("variables.py", "train", env=STRICT_DEVICE)
    assert run.returncode == 0 and run.result, describe(run)
    stats = run.result["stats"]
    assert stats["peak_bytes_in_use"] > stats["bytes_limit"]
    assert stats["num_evictions"] > 0 and stats["num_page_ins"] > 0
    assert run.result["touches"] == []
    assert run.result["losses"] == stock.result["losses"]  # single-threaded: bit for bit


def test_the_only_unpinned_touch_of_an_assign_is_the_eager_runtimes_read_of_the_handle():
    """docs/robustness.md: before an op's kernel runs, TensorFlow's eager runtime
    reads the variable's resource handle (the length of its device string, at
    offset 8), outside any kernel; on the emulated device that handle may be in
    an evicted tiny page. That one touch, by no kernel, is all strict mode
    reports, and the values are right (a GPU keeps handles in host memory)."""
    run = run_program("probes.py", "handle_read", env=STRICT_DEVICE)
    assert run.result, describe(run)
    for r in run.result["rounds"]:
        assert r["values"] == [3.0, 3.0]
        assert len(r["touches"]) <= 1, r["touches"]
        for touch in r["touches"]:
            assert touch["op"] == "-"  # no kernel
            assert (touch["address"] - touch["allocation_address"]) % 256 == 8, touch
            assert touch["allocation_bytes"] == 2 << 20  # a small-object page
