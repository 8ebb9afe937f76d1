"""XLA under LMS (tests/tf_programs/xla.py; Note [XLA under LMS] in
tensorflow_lms_allocator/overlay/keras_jit.py, Note [XLA frees live variables on its
error path] in cc/tf_adapter/live_variables.h).

Keras 3 compiles every fit step with XLA when it sees a GPU; these tests make
it see one (its physical device list) on this CPU-only machine.
"""

from __future__ import annotations

import pytest

from tf_helpers import describe, run_program

LMS_ON = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "256", "TF_LMS_ENABLED": "1"}
LMS_OFF = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "256", "TF_LMS_ENABLED": "0"}


def test_with_lms_on_keras_does_not_compile_the_step_with_xla_unless_asked():
    run = run_program("xla.py", "auto", env=LMS_ON)
    assert run.result, describe(run)
    resolved, logged = run.result["resolved"], run.result["logged"]
    assert resolved == {"auto": False, "auto_again": False, "true": True,
                        "true_again": True, "false": False}
    # One line each, once per process: why "auto" is off and how to force XLA;
    # that an explicit jit_compile=True must fit in device memory per cluster.
    assert len(logged) == 2, logged
    assert "jit_compile='auto' resolves to False because LMS is on" in logged[0]
    assert "jit_compile=True" in logged[0]
    assert "must fit in device memory together" in logged[1]
    assert run.result["trained"]


def test_with_lms_off_keras_compiles_the_step_with_xla_as_on_any_gpu_machine():
    run = run_program("xla.py", "auto", env=LMS_OFF)
    assert run.result, describe(run)
    assert run.result["resolved"]["auto"] is True  # Keras saw the GPU
    assert run.result["logged"] == []
    assert run.result["trained"]


def test_a_jit_compiled_step_trains_bit_identically_while_its_variables_are_evicted():
    """An XLA cluster is one kernel: its variables are pinned (paged in) for
    it, and evicted between steps by the tensors held meanwhile."""
    stock = run_program("xla.py", "loop", env={"LMS_TEST_STOCK": "1"})
    lms = run_program("xla.py", "loop", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                                              "TF_LMS_ENABLED": "1"})
    assert stock.result and lms.result, describe(lms)
    stats = lms.result["stats"]
    assert stats["peak_bytes_in_use"] > 64 << 20
    assert stats["num_evictions"] > 0 and stats["num_page_ins"] > 0, stats
    assert lms.result["held_ok"]
    assert lms.result["losses"] == stock.result["losses"]
    assert lms.result["weights"] == stock.result["weights"]


def test_a_failed_xla_step_leaves_the_variables_intact():
    """TensorFlow frees the variables' buffers inside the failing XLA kernel
    while the variables still hold them: before the guard, unrelated tf.fill
    calls then changed the weights and every variable was freed twice at
    exit (stock TensorFlow's own allocator aborts on that second free). The
    step fails only with LMS off here: with LMS on, the emulated device holds
    XLA's temporaries in host memory whatever their size (the next test), and
    the guard is the same code either way (the kernel pins its variables)."""
    run = run_program("xla.py", "oom", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "50",
                                             "TF_LMS_ENABLED": "0", "TF_CPP_MIN_LOG_LEVEL": "1"})
    assert run.returncode == 0 and run.result, describe(run)
    r = run.result
    assert r["error"]["type"] == "ResourceExhaustedError", r["error"]
    assert "Out of memory while trying to allocate" in r["error"]["message"]
    assert r["variables_changed_by_the_failed_step"] == 0
    assert r["variables_changed_by_unrelated_fills"] == 0
    assert r["fills"] > 0 and r["fills_ok"]
    assert "an XLA kernel freed the buffer of a variable that still holds it" in run.stderr
    assert "NOT_FOUND" not in run.stderr  # nothing freed twice


def test_with_lms_on_the_xla_step_that_does_not_fit_runs_from_host_memory():
    run = run_program("xla.py", "oom", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "50",
                                             "TF_LMS_ENABLED": "1"})
    assert run.returncode == 0 and run.result, describe(run)
    assert run.result["error"] is None
    assert run.result["stats"]["num_overflow_placements"] > 0
    assert run.result["variables_changed_by_unrelated_fills"] == 0
    assert "NOT_FOUND" not in run.stderr
