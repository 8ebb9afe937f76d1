"""Never crash, never corrupt (issue 6, item 3): fork() children, NumPy
conversions that do not fit, and a huge constant inside a tf.function.

The TensorFlow programs are in tests/tf_programs/robustness.py; each runs in a
subprocess of its own on a 64 MiB emulated device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import GRANULE
from tf_helpers import describe, run_program

DEVICE = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64"}
LMS_ON = {**DEVICE, "TF_LMS_ENABLED": "1"}
LMS_OFF = {**DEVICE, "TF_LMS_ENABLED": "0"}


# --- fork() -----------------------------------------------------------------


def _wait_exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _reap(pid: int) -> None:
    """Kills and reaps a child the test did not wait for (it failed early)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def test_fork_child_has_its_own_engine_memory_both_ways(make_engine):
    """After fork() each process writes, evicts and reuses device and host
    memory; neither sees the other's bytes (Note [Fork])."""
    engine = make_engine(8, 32)
    a = engine.allocate(3 * GRANULE)
    engine.fill_pattern(a, 3 * GRANULE, 1)
    b = engine.allocate(2 * GRANULE)
    engine.fill_pattern(b, 2 * GRANULE, 2)
    engine.evict(b)  # the host pool is carried over too
    child_ready_r, child_ready_w = os.pipe()
    parent_done_r, parent_done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            inherited = (engine.verify_pattern(a, 3 * GRANULE, 1) == -1
                         and engine.verify_pattern(b, 2 * GRANULE, 2) == -1)
            engine.fill_pattern(a, 3 * GRANULE, 11)
            engine.fill_pattern(b, 2 * GRANULE, 12)
            c = engine.allocate(7 * GRANULE)  # evicts `a`, reuses its granules
            engine.fill_pattern(c, 7 * GRANULE, 13)
            os.write(child_ready_w, b"x")
            os.read(parent_done_r, 1)  # the parent has written the same granules
            mine = (engine.verify_pattern(a, 3 * GRANULE, 11) == -1
                    and engine.verify_pattern(b, 2 * GRANULE, 12) == -1
                    and engine.verify_pattern(c, 7 * GRANULE, 13) == -1)
            code = 0 if inherited and mine else 2
        finally:
            os._exit(code)
    try:
        os.read(child_ready_r, 1)
        parent_intact = (engine.verify_pattern(a, 3 * GRANULE, 1) == -1
                         and engine.verify_pattern(b, 2 * GRANULE, 2) == -1)
        d = engine.allocate(5 * GRANULE)  # the free granules the child also took
        engine.fill_pattern(d, 5 * GRANULE, 21)
        engine.fill_pattern(b, 2 * GRANULE, 22)
        os.write(parent_done_w, b"x")
        child_code = _wait_exit_code(pid)
    finally:
        _reap(pid)
        for fd in (child_ready_r, child_ready_w, parent_done_r, parent_done_w):
            os.close(fd)
    assert parent_intact, "the child's writes reached the parent's allocations"
    assert child_code == 0, "the child saw the parent's writes"
    assert engine.verify_pattern(a, 3 * GRANULE, 1) == -1
    assert engine.verify_pattern(b, 2 * GRANULE, 22) == -1
    assert engine.verify_pattern(d, 5 * GRANULE, 21) == -1
    engine.free(d)


def test_fork_child_of_a_child_keeps_working(make_engine):
    """The fork handlers leave the engine unlocked and usable in each process,
    also after a second fork from the child."""
    engine = make_engine(8, 32)
    a = engine.allocate(4 * GRANULE)
    engine.fill_pattern(a, 4 * GRANULE, 5)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            grandchild = os.fork()
            if grandchild == 0:
                ok = engine.verify_pattern(a, 4 * GRANULE, 5) == -1
                engine.fill_pattern(a, 4 * GRANULE, 6)
                os._exit(0 if ok else 2)
            ok = _wait_exit_code(grandchild) == 0
            ok = ok and engine.verify_pattern(a, 4 * GRANULE, 5) == -1
            x = engine.allocate(6 * GRANULE)  # evicts `a` in the child only
            engine.fill_pattern(x, 6 * GRANULE, 7)
            ok = ok and engine.verify_pattern(x, 6 * GRANULE, 7) == -1
            code = 0 if ok else 3
        finally:
            os._exit(code)
    assert _wait_exit_code(pid) == 0
    assert engine.verify_pattern(a, 4 * GRANULE, 5) == -1
    assert not engine.inspect(a)["evicted"]


_CUT_OFF_CHILD = """
import os, resource
from tensorflow_lms_allocator.engine import Engine
G = 64 << 10
engine = Engine(8 * G, host_bytes=32 * G, granule_bytes=G)
a = engine.allocate(3 * G)
engine.fill_pattern(a, 3 * G, 1)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
fds = []
try:  # a full descriptor table: the fork handler cannot make the child's copy
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
pid = os.fork()
if pid == 0:
    engine.fill_pattern(a, 3 * G, 9)  # would write the parent's memory
    os._exit(0)
for fd in fds:
    os.close(fd)
_, status = os.waitpid(pid, 0)
print("child_signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
print("parent_ok", engine.verify_pattern(a, 3 * G, 1) == -1)
"""


def test_fork_child_that_cannot_get_a_copy_is_cut_off_not_shared():
    """If the copy for the child cannot be made, the child's LMS memory is
    inaccessible: its write faults in the child, and says why, instead of
    landing in the parent's tensor."""
    proc = subprocess.run([sys.executable, "-c", _CUT_OFF_CHILD], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "child_signal 11" in proc.stdout, proc.stdout + proc.stderr
    assert "parent_ok True" in proc.stdout
    assert "could not get its own copy of the emulated device's memory" in proc.stderr


@pytest.mark.parametrize("env", [LMS_ON, LMS_OFF], ids=["lms_on", "lms_off"])
def test_fork_child_writes_never_reach_the_parent_tensors(env):
    run = run_program("robustness.py", "fork_child_writes", env=env)
    assert run.result, describe(run)
    r = run.result
    assert r["child_exit"] == 0 and "child_error" not in r, describe(run)
    assert r["child_own_ok"] and r["child_inherited_ok"], describe(run)
    if env is LMS_ON:
        assert r["child_evictions"] > 0  # the child evicted the parent's tensors
    assert r["parent_ok"], "the child's tensors overwrote the parent's"
    assert r["parent_new_ok"]


@pytest.mark.parametrize("env", [LMS_ON, LMS_OFF], ids=["lms_on", "lms_off"])
def test_fork_parent_writes_never_reach_the_child_tensors(env):
    run = run_program("robustness.py", "fork_parent_writes", env=env)
    assert run.result, describe(run)
    r = run.result
    assert r["child_exit"] == 0 and "child_error" not in r, describe(run)
    assert r["child_before_ok"] and r["child_inherited_ok"], describe(run)
    assert r["child_own_ok"], "the parent's tensors overwrote the child's"
    assert r["parent_ok"] and r["parent_inherited_ok"]


def test_multiprocessing_spawn_child_gets_a_fresh_device():
    run = run_program("robustness.py", "spawn", env=LMS_ON)
    assert run.result, describe(run)
    r = run.result
    assert r["child_exit"] == 0, describe(run)
    assert r["child"]["ok"] and r["child"]["bytes_limit"] == 64 << 20
    assert r["parent_ok"]


# --- allocations outside any kernel ------------------------------------------


def _assert_oom_naming_the_device(error: dict, run) -> None:
    assert error["type"] == "ResourceExhaustedError", describe(run)
    assert "OOM when allocating tensor" in error["message"], describe(run)
    assert "/job:localhost/replica:0/task:0/device:CPU:0" in error["message"]
    assert "lms_emulated_device" in error["message"]  # the allocator and its reason


@pytest.mark.parametrize("env", [LMS_OFF, LMS_ON], ids=["lms_off", "lms_on"])
def test_numpy_conversion_that_does_not_fit_is_no_crash(env):
    """tf.constant of an unaligned 40 MiB NumPy array on a full 64 MiB device:
    TensorFlow copies it outside any kernel and never checks the allocation,
    which was a SIGSEGV. It now holds the right values (Note [Allocations
    outside kernels]); a kernel's output must still fit the device."""
    run = run_program("robustness.py", "numpy_on_full_device", env=env)
    assert run.returncode == 0 and run.result, describe(run)  # not killed by a signal
    r = run.result
    assert not r["aligned"]  # the copying path was exercised
    assert r["error"] is None, describe(run)
    assert r["value_ok"] and r["sum_ok"]
    if "kernel_error" in r:
        _assert_oom_naming_the_device(r["kernel_error"], run)
    else:
        assert r["kernel_output"] == 4.0  # 2 * array[1]
    assert r["kept_ok"]
    assert r["resident_growth_mib"] < 100  # 400 MiB converted and freed
    assert "NOT_FOUND" not in run.stderr  # every buffer freed where it came from


@pytest.mark.parametrize("env", [LMS_OFF, LMS_ON], ids=["lms_off", "lms_on"])
def test_numpy_array_larger_than_the_device_converts(env):
    """tf.constant of an unaligned 200 MiB NumPy array on a 64 MiB device was
    a SIGSEGV with LMS on; it now holds the right values."""
    run = run_program("robustness.py", "numpy_larger_than_device", env=env)
    assert run.returncode == 0 and run.result, describe(run)
    r = run.result
    assert not r["aligned"]
    assert r["error"] is None, describe(run)
    assert r["value_ok"] and r["slice_sum"] == r["expected_sum"]


@pytest.mark.parametrize("env", [LMS_OFF, LMS_ON], ids=["lms_off", "lms_on"])
def test_fit_with_numpy_data_larger_than_the_device_trains(env):
    """model.fit with a 192 MiB NumPy x on a 64 MiB device trains, as stock
    TensorFlow does on a GPU (the data set stays in host memory)."""
    run = run_program("robustness.py", "fit_large_numpy", env=env)
    assert run.returncode == 0 and run.result, describe(run)
    assert run.result["error"] is None, describe(run)
    assert not run.result["aligned"]
    assert 0.0 <= run.result["loss"] < 10.0


@pytest.mark.parametrize("env", [LMS_OFF, LMS_ON], ids=["lms_off", "lms_on"])
def test_huge_fill_in_a_function_is_an_oom_naming_the_device(env):
    """A 200 MiB tf.fill in a tf.function on 64 MiB: Grappler makes it a Const
    whose parse failed as InvalidArgumentError "Cannot parse tensor from
    proto". It is an OOM that names the device (or, where LMS can hold it,
    the right value), and the device keeps working."""
    run = run_program("robustness.py", "fill_in_function", env=env)
    assert run.returncode == 0 and run.result, describe(run)
    expected = {"returned": 1.0, "multiplied": 2.0 * 50 * (1 << 20)}
    for case, value in expected.items():
        outcome = run.result[case]
        if outcome["error"] is None:
            assert outcome["value"] == value
        else:
            _assert_oom_naming_the_device(outcome["error"], run)
    if env is LMS_OFF:  # a device without LMS cannot hold the constant
        error = run.result["returned"]["error"]
        assert error is not None, describe(run)
        assert "constant of a kernel being created" in error["message"]
    assert run.result["after"] == float(1 << 20)


@pytest.mark.parametrize("source", ["numpy", "constant"])
@pytest.mark.parametrize("env", [LMS_OFF, LMS_ON], ids=["lms_off", "lms_on"])
def test_a_dataset_larger_than_the_device_iterates(env, source):
    """Dataset.from_tensor_slices over 60 MiB on a 24 MiB device died with
    SIGSEGV in make_iterator, LMS on or off: tf.data's MakeIterator kernel runs
    Grappler, which fills a fake input it allocated with a plain Tensor
    constructor, unchecked (grappler::InitializeTensor dereferenced the null
    the device returned). With LMS on the request is placed in host memory at
    its address; off, it is served from ordinary host memory, as a request
    outside any kernel is (Note [Allocations outside kernels])."""
    run = run_program("robustness.py", "slices_larger_than_device", source,
                      env={**env, "TF_LMS_CPU_DEVICE_MEMORY_MB": "24",
                           "TF_CPP_MIN_LOG_LEVEL": "1"})
    assert run.returncode == 0 and run.result, describe(run)  # not killed by a signal
    assert run.result["rows"] == 15 * 1024 and run.result["first_column_ok"]
    if env is LMS_ON:  # one warning, naming the kernel and the size
        assert run.result["stats"]["num_overflow_placements"] > 0
        assert "kernel MakeIterator needs 60.0 MiB" in run.stderr
        assert run.stderr.count("is placed in host memory at its device address") == 1


def test_an_optional_request_through_tensorflows_allocator_evicts_nothing():
    # AllocateRaw with retry_on_failure=false (cuDNN's autotuning scratch and
    # workspaces on a GPU): served from free device memory only; refused on a
    # full device, without evicting and without host memory, and counted.
    run = run_program("probes.py", "optional", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                                                    "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    r = run.result
    assert r["held"] == 8
    assert r["optional"] == ["RESOURCE_EXHAUSTED", 0]
    assert r["evicted_for_it"] == 0 and r["refused"] == 1
    assert r["needed"] == ["OK", True]  # the same request, not optional, is served


@pytest.mark.slow
def test_strict_mode_never_crashes_a_kernel_writing_its_output_in_host_memory():
    """TF_LMS_STRICT=1 changes neither what a program computes nor whether it
    runs: a matmul whose output the device cannot hold is placed in host
    memory and written there by the kernel (Note [Strict access follows
    holders]); before, the fault handler ran below the gemm's stack pointer
    and the process died in free() in 3 of 3 runs (Note [Strict mode's own
    signal stack]), and MatMul was reported touching its own output."""
    device = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "16", "TF_LMS_ENABLED": "1"}
    plain = run_program("robustness.py", "matmul_outputs_in_host_memory", env=device)
    assert plain.returncode == 0 and plain.result, describe(plain)
    for _ in range(3):
        strict = run_program("robustness.py", "matmul_outputs_in_host_memory",
                             env={**device, "TF_LMS_STRICT": "1"})
        assert strict.returncode == 0 and strict.result, describe(strict)
        assert strict.result["stats"]["num_overflow_placements"] > 0
        assert strict.result["total"] == plain.result["total"]
        assert "MatMul" not in strict.result["touched_by"], strict.result["touched_by"]
