"""Kernel contexts that nest on one thread or end on another thread (Note
[Kernel context lifetime] in kernel_pins.h), in real TensorFlow programs
(tests/tf_programs/kernel_contexts.py)."""

from __future__ import annotations

import pytest

from tf_helpers import describe, run_program

pytestmark = pytest.mark.gpu_wheel

DEVICE = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1"}


@pytest.mark.parametrize("host_mib", [None, "16"], ids=["host_memory", "no_host_memory"])
@pytest.mark.parametrize("case", ["nested_oom", "nested_oom_function"])
def test_nested_kernel_does_not_wait_when_only_its_own_outer_kernel_holds_the_memory(
        case, host_mib):
    """Before, the op inside tf.py_function counted the py_function's own
    context as another kernel and waited the whole 10 s retry budget for it.
    No release can come: with LMS on its request is placed in host memory at
    once, or, if host memory for evicted tensors cannot hold it, fails at once."""
    env = {**DEVICE, "TF_CPP_MIN_LOG_LEVEL": "1"}  # the warning is shown
    if host_mib is not None:
        env["TF_GPU_HOST_MEM_LIMIT_IN_MB"] = host_mib
    run = run_program("kernel_contexts.py", case, env=env)
    assert run.returncode == 0 and run.result, describe(run)
    out = run.result
    assert out["inside"]["live"] == 1 and out["inside"]["thread"] == 1  # only its own
    if host_mib is None:
        assert out["error"] is None and out["inner_min"] == 1.0, describe(run)
        assert out["placed_in_host_memory"] == 1
        assert "is placed in host memory at its device address" in run.stderr
    else:
        assert out["error"] == "ResourceExhaustedError"
    assert out["seconds"] < 2.0, f"waited {out['seconds']:.1f} s for its own outer kernel"
    assert out["sum"] == 2.0 * (10 << 20)  # the py_function still completes
    assert out["after"] == float(2 << 20)  # and the process keeps working
    assert out["contexts_after"]["live"] == 0


def test_context_destroyed_on_another_thread_leaves_its_creator_with_no_stale_context():
    run = run_program("kernel_contexts.py", "cross_thread", env=DEVICE)
    assert run.returncode == 0 and run.result, describe(run)
    out = run.result
    assert out["value"] == 1.0
    pool_thread = out["before"]["thread_id"]
    assert out["enqueuer"] != pool_thread
    # While the dequeue's done callback runs, its context may still be live
    # on the pool thread: never more than that one and the py_function's.
    assert out["after"]["thread_id"] == pool_thread
    assert 1 <= out["after"]["thread"] <= 2
    # Once the enqueuer destroyed it, the pool thread holds only the probe's
    # own context, and nothing is live anywhere after the run.
    assert out["probe"]["thread_id"] == pool_thread
    assert out["probe"] == {"live": 1, "thread": 1, "thread_id": pool_thread}
    assert out["main_after"]["live"] == 0 and out["main_after"]["thread"] == 0
