"""Settings that cannot give a working device, and the adapter's contract with
TensorFlow and Python (issue 6, items 4 and 6).

Every configuration runs in a subprocess (tf_helpers.run_program) of
tests/tf_programs/settings_probes.py: TensorFlow creates its devices once per
process, and a bad setting must fail the import itself.
"""

from __future__ import annotations

import os
import re

import pytest

from tf_helpers import describe, log_severity, run_program

MIB = 1 << 20
MACHINE_MIB = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // MIB
MAX_MIB = MACHINE_MIB // 2 * 2  # whole 2 MiB granules
LMS_64 = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1"}


def probe(name: str, *args: str, env: dict[str, str] | None = None):
    run = run_program("settings_probes.py", name, *args, env=env)
    assert run.result is not None, describe(run)
    return run


# --- settings refused at import ------------------------------------------------

REFUSED_DEVICE_VALUES = [
    ("TF_LMS_CPU_DEVICE_MEMORY_MB", "0", "is less than one granule (2 MiB)"),
    ("TF_LMS_CPU_DEVICE_MEMORY_MB", "1", "is less than one granule (2 MiB)"),
    ("TF_LMS_CPU_DEVICE_MEMORY_MB", str(MAX_MIB + 2), "is more than this machine's memory"),
    ("TF_LMS_CPU_DEVICE_MEMORY_MB", "999999999999", "is more than this machine's memory"),
    ("TF_GPU_HOST_MEM_LIMIT_IN_MB", "1", "is less than one granule (2 MiB)"),
    ("TF_GPU_HOST_MEM_LIMIT_IN_MB", "99999999999", "is more than this machine's memory"),
]
REFUSED_GRANULES = ["0", "1", "3", "12", "2048", "8x", "-8"]


@pytest.fixture(scope="module")
def refused():
    """Every refused value's import outcome, from one process (each import
    of TensorFlow takes seconds): {"VARIABLE=VALUE": [type, message]}, each
    value set over TF_LMS_CPU_DEVICE_MEMORY_MB=64 alone."""
    assignments = [f"{variable}={value}" for variable, value, _ in REFUSED_DEVICE_VALUES]
    assignments += ["TF_LMS_CPU_DEVICE_MEMORY_MB=-2"]
    assignments += [f"TF_LMS_GRANULE_MB={value}" for value in REFUSED_GRANULES]
    assignments += ["TF_LMS_HUGE_PAGES=on"]
    run = probe("refused_values", *assignments, env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64"})
    assert set(run.result["outcomes"]) == set(assignments), describe(run)
    return run.result["outcomes"]


def refusal(refused: dict, assignment: str) -> tuple[str, str]:
    """(type, message) of the import with ASSIGNMENT; fails if it imported."""
    outcome = refused[assignment]
    assert outcome is not None, f"the import with {assignment} succeeded"
    return tuple(outcome)


@pytest.mark.parametrize("variable,value,why", REFUSED_DEVICE_VALUES)
def test_a_value_that_cannot_give_a_working_device_is_a_value_error_at_import(
        refused, variable, value, why):
    kind, message = refusal(refused, f"{variable}={value}")
    assert kind == "ValueError", message
    assert message.startswith(f"{variable}='{value}' "), message
    assert why in message, message
    assert f"from 2 to {MAX_MIB}" in message, message  # the valid range


def test_a_negative_value_is_said_to_be_negative(refused):
    kind, message = refusal(refused, "TF_LMS_CPU_DEVICE_MEMORY_MB=-2")
    assert kind == "ValueError" and "TF_LMS_CPU_DEVICE_MEMORY_MB='-2' is negative" in message


@pytest.mark.parametrize("variable,value,used", [
    ("TF_LMS_CPU_DEVICE_MEMORY_MB", "533", 532),
    ("TF_GPU_HOST_MEM_LIMIT_IN_MB", "65", 64),
])
def test_a_value_between_granules_is_rounded_down_with_a_warning(variable, value, used):
    """As TensorFlow rounds its own limits, so that a computed cap (half of a
    peak, say) works; one line says what is used."""
    run = probe("import_outcome", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                                       "TF_CPP_MIN_LOG_LEVEL": "1", variable: value})
    assert run.result["error"] is None, describe(run)
    if variable == "TF_LMS_CPU_DEVICE_MEMORY_MB":
        assert run.result["bytes_limit"] == used * MIB
    line = f"{variable}={value} is not a whole number of 2 MiB granules: using {used} MiB"
    assert run.stderr.count(line) == 1, run.stderr


def test_a_granule_that_is_not_a_power_of_two_from_2_to_1024_is_a_value_error(refused):
    for value in REFUSED_GRANULES:
        kind, message = refusal(refused, f"TF_LMS_GRANULE_MB={value}")
        assert kind == "ValueError", message
        assert message.startswith(f"TF_LMS_GRANULE_MB='{value}' is not a power of two "
                                  "from 2 to 1024"), message


def test_huge_pages_are_auto_or_off(refused):
    """TF_LMS_HUGE_PAGES=off: the emulated device maps small pages whatever
    the machine allows, and its log line says so, then which copy it uses;
    any other word than auto or off is refused."""
    kind, message = refusal(refused, "TF_LMS_HUGE_PAGES=on")
    assert kind == "ValueError", message
    assert message.startswith("TF_LMS_HUGE_PAGES='on' is not auto (the default"), message
    run = probe("import_outcome", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                                       "TF_LMS_HUGE_PAGES": "off", "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert run.result["error"] is None, describe(run)
    lines = [line for line in run.stderr.splitlines() if "LMS serves" in line]
    # Then how it copies, whichever method the process measured fastest.
    assert len(lines) == 1 and re.search(
        r", huge pages off, copies by (streaming stores in one stream|"
        r"streaming stores across four pages|memcpy)$", lines[0]), run.stderr


def test_unmapped_evictions_are_said_in_the_log_line_and_give_way_to_strict_mode():
    """TF_LMS_UNMAP_EVICTED=1: the device's log line says evicted tensors are
    left unmapped; with TF_LMS_STRICT=1 as well, strict mode's no-access
    mappings win, and a warning says the other does nothing."""
    env = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_UNMAP_EVICTED": "1",
           "TF_CPP_MIN_LOG_LEVEL": "0"}
    for strict in (False, True):
        run = probe("import_outcome", env={**env, "TF_LMS_STRICT": "1" if strict else "0"})
        assert run.result["error"] is None, describe(run)
        lines = [line for line in run.stderr.splitlines() if "LMS serves" in line]
        assert len(lines) == 1, run.stderr
        assert ("strict mode (TF_LMS_STRICT)" in lines[0]) == strict, lines[0]
        assert ("evicted tensors unmapped (TF_LMS_UNMAP_EVICTED)" in lines[0]) != strict
        assert ("TF_LMS_UNMAP_EVICTED=1 has no effect with TF_LMS_STRICT=1" in run.stderr) == \
            strict, run.stderr


def test_a_larger_granule_rounds_allocations_and_the_device():
    """TF_LMS_GRANULE_MB=8: a 9 MiB tensor takes two granules (10 MiB with the
    default 2 MiB: test_gpu_wiring.py), and a device of 20 MiB is 16 MiB,
    said once."""
    env = {**LMS_64, "TF_LMS_CPU_DEVICE_MEMORY_MB": "20", "TF_CPP_MIN_LOG_LEVEL": "1",
           "TF_LMS_GRANULE_MB": "8"}
    run = probe("granule", env=env)
    assert run.result["largest_alloc_size"] == 16 * MIB, describe(run)
    assert run.result["sum"] == 0.0
    line = ("TF_LMS_CPU_DEVICE_MEMORY_MB=20 is not a whole number of 8 MiB granules: "
            "using 16 MiB")
    assert run.stderr.count(line) == 1, run.stderr


def test_prefetching_without_the_learned_policy_is_said_to_do_nothing():
    run = probe("import_outcome", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_POLICY": "lru",
                                       "TF_LMS_PREFETCH": "1", "TF_CPP_MIN_LOG_LEVEL": "1"})
    assert run.result["error"] is None, describe(run)
    assert "TF_LMS_PREFETCH=1 has no effect with TF_LMS_POLICY=lru" in run.stderr
    learned = probe("import_outcome", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                                           "TF_LMS_PREFETCH": "1", "TF_CPP_MIN_LOG_LEVEL": "1"})
    assert "TF_LMS_PREFETCH" not in learned.stderr  # learned is the default


def test_valid_values_the_process_cannot_reserve_are_a_memory_error_at_import():
    """16 GiB of address space (ulimit -v) holds TensorFlow but not the
    device's address ranges (about twice device plus host memory)."""
    run = probe("import_outcome", "16",
                env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                     "TF_GPU_HOST_MEM_LIMIT_IN_MB": str(MAX_MIB)})
    kind, message = run.result["error"]
    assert kind == "MemoryError", describe(run)
    assert (f"TF_LMS_CPU_DEVICE_MEMORY_MB=64, TF_GPU_HOST_MEM_LIMIT_IN_MB={MAX_MIB}"
            in message), message
    assert "could not be created" in message and "address space" in message


def test_the_smallest_device_and_the_largest_host_limit_import_and_cap_the_device():
    run = probe("import_outcome", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "2",
                                       "TF_GPU_HOST_MEM_LIMIT_IN_MB": str(MAX_MIB)})
    assert run.result["error"] is None, describe(run)
    assert run.result["bytes_limit"] == 2 * MIB
    assert run.result["total"] == 65536.0


def test_tensorflows_64_gib_host_default_works_on_this_machine():
    """TF_GPU_HOST_MEM_LIMIT_IN_MB unset: TensorFlow's 64 GiB, capped at the
    machine's memory (the host pool is a sparse file, so it costs nothing
    until used)."""
    run = probe("import_outcome", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64"})
    assert run.result["error"] is None, describe(run)
    assert run.result["bytes_limit"] == 64 * MIB


def test_fixing_a_bad_value_and_importing_again_works():
    run = probe("retry_import", env={"TF_LMS_ENABLED": "1"})
    assert run.result["first"][0] == "ValueError"
    assert "TF_LMS_CPU_DEVICE_MEMORY_MB='1'" in run.result["first"][1]
    assert run.result["second"] is None, describe(run)
    assert run.result["bytes_limit"] == 64 * MIB
    assert run.result["total"] == 65536.0


def test_a_retry_after_tensorflow_created_its_devices_says_so():
    run = probe("retry_import", "ops")
    kind, message = run.result["second"]
    assert kind == "ImportError"
    assert "created its devices after the earlier import" in message, message
    assert "must be imported before TensorFlow" not in message
    assert "start a new Python process" in message


# --- a device that cannot be created at first use --------------------------------

def test_a_device_that_cannot_be_created_fails_every_op_naming_the_setting():
    run = probe("device_unavailable", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "1024"})
    for name in ("first_op", "second_op", "statistics", "session"):
        assert run.result[name] is not None, f"{name} ran uncapped\n{describe(run)}"
        kind, message = run.result[name]
        assert kind == "RuntimeError", (name, kind, message)
        assert "TF_LMS_CPU_DEVICE_MEMORY_MB=1024" in message, message
        assert "could not be created" in message and "address space" in message
    assert run.returncode == 0


# --- names and values as TensorFlow takes them ----------------------------------

def test_tensorflows_device_names_and_bool_likes_are_accepted():
    run = probe("device_names", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64"})
    r = run.result
    assert r["flags"] == {"np_true": True, "int_1": True, "np_int_1": True,
                          "np_false": False, "int_0": False, "true": True}
    for name, error in r["refused"].items():
        assert error is not None and error[0] == "TypeError", (name, error)
    assert r["printed"] == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert r["limits"] == {name: 64 * MIB for name in r["limits"]}, r["limits"]
    for name, error in r["bad"].items():
        assert error is not None, name
    assert r["bad"]["bool"][0] == "TypeError"
    assert r["bad"]["gpu_full"][0] == "ValueError"
    assert "GPU:0 has no LMS allocator" in r["bad"]["gpu_full"][1]
    assert r["bad"]["other_task"][0] == "ValueError"
    assert r["bad"]["cpu1"][0] == "ValueError"


# --- strict mode and faulthandler ---------------------------------------------

@pytest.mark.parametrize("when", ["before_eviction", "after_eviction"])
def test_strict_mode_keeps_reporting_when_faulthandler_is_enabled_late(when):
    run = probe("strict_faulthandler", when, env={**LMS_64, "TF_LMS_STRICT": "1"})
    assert run.returncode == 0, describe(run)
    assert run.result["touches"] >= 1
    assert run.result["intact"] and run.result["faulthandler"]
    assert "Fatal Python error" not in run.stderr


def test_a_real_crash_under_strict_mode_still_reaches_faulthandler():
    run = run_program("settings_probes.py", "strict_faulthandler", "crash",
                      env={**LMS_64, "TF_LMS_STRICT": "1"}, timeout=120)
    assert run.result and run.result["touches"] >= 1, describe(run)
    assert run.returncode == -11, describe(run)  # SIGSEGV, not a hang or a survival
    assert "Fatal Python error: Segmentation fault" in run.stderr
    assert "survived_null_read" not in run.stdout


# --- the allocator honours what TensorFlow asks ------------------------------------

def test_a_stricter_alignment_keeps_the_requested_size():
    run = probe("aligned", env={**LMS_64, "TF_LMS_STRICT": "1"})
    r = run.result
    for alignment in ("64", "256", "4096", str(2 * MIB)):
        assert r[alignment]["aligned"], (alignment, r[alignment])
        assert r[alignment]["requested"] == 1000, (alignment, r[alignment])
    assert r["4096"]["allocated"] == 2 * MIB  # placed on a granule
    assert r["evicted"] > 0 and r["intact"]
    assert [t["allocation_bytes"] for t in r["touches"]] == [1000], r["touches"]


def test_retry_on_failure_false_fails_at_once_while_another_kernel_holds_memory():
    run = probe("no_retry", env=LMS_64)
    r = run.result
    assert not r["False"]["ok"], r
    assert r["False"]["seconds"] < 1.0, r  # the other kernel holds it for 3 s
    assert "lms_emulated_device" in r["False"]["message"]
    # With retry (TensorFlow's default) it waits for the other kernel's
    # release (about 2.8 s here), not the whole 10 s budget, and then gets
    # the memory: the other kernel unpins before it stops counting as running,
    # and the waiter makes its last attempt after that.
    assert r["True"]["ok"], r
    assert 1.0 < r["True"]["seconds"] < 9.0, r


# --- errors across the C boundary -------------------------------------------------

@pytest.mark.parametrize("level,shown", [("0", True), ("3", False)])
def test_allocation_failures_are_logged_through_tensorflow(level, shown):
    # 128 MiB fits neither the 64 MiB device nor host memory for evicted
    # tensors (with LMS on it would otherwise be placed there).
    run = probe("oom_logging", env={**LMS_64, "TF_CPP_MIN_LOG_LEVEL": level,
                                     "TF_GPU_HOST_MEM_LIMIT_IN_MB": "64"})
    assert run.result["error"][0] == "ResourceExhaustedError"
    assert ("tensorflow_lms_allocator: allocation of" in run.stderr) == shown, run.stderr
    if shown:  # TensorFlow's log format: severity, time, file:line
        line = next(x for x in run.stderr.splitlines() if "allocation of" in x)
        assert log_severity(line) == "W" and "lms_allocator.cc:" in line, line


def test_python_raises_the_exception_of_the_error_code():
    run = probe("error_codes")
    r = run.result
    assert r["names"] == {"0": "OK", "3": "INVALID_ARGUMENT", "5": "NOT_FOUND",
                          "8": "RESOURCE_EXHAUSTED", "9": "FAILED_PRECONDITION",
                          "13": "INTERNAL", "99": "UNKNOWN"}
    assert r["by_code"] == {"3": "ValueError", "5": "ValueError", "8": "MemoryError",
                            "9": "RuntimeError", "13": "RuntimeError"}
    assert r["unknown_setting"][0] == "INVALID_ARGUMENT"
    assert r["errors"]["late_enable"][0] == "RuntimeError"
    assert "TF_LMS_ENABLED" in r["errors"]["late_enable"][1]
    assert r["errors"]["no_device"][0] == "ValueError"
    assert "TF_LMS_CPU_DEVICE_MEMORY_MB" in r["errors"]["no_device"][1]
