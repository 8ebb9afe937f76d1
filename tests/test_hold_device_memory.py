"""tensorflow_lms_allocator.hold_device_memory in real TensorFlow training.

A Keras model trained with its middle steps inside a hold that leaves the
emulated device half the model's peak evicts there and nowhere else, and
its losses and weights are bit-identical to the same model trained without
the hold (op determinism, one thread each side). The held bytes are pinned
(never evicted) while held and given back after, also when the block
raises; bad sizes are ValueErrors naming the argument, a hold that cannot be
made room for is a MemoryError that says so and leaves nothing held.
"""

from __future__ import annotations

import pytest

from tf_helpers import describe, run_program


@pytest.fixture(scope="module")
def run() -> dict:
    done = run_program("hold_memory.py", env={
        "TF_LMS_CPU_DEVICE_MEMORY_MB": "128", "TF_LMS_ENABLED": "1",
        "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"})
    assert done.result, describe(done)
    return done.result


def test_steps_inside_a_hold_evict_and_train_bit_identically(run: dict) -> None:
    assert run["hold"] > run["device_bytes"] - run["peak"], run  # the model cannot fit beside it
    assert run["unpressed_evictions"] == 0, run
    assert run["phases"]["held"] > 0, run
    assert run["phases"]["after"] == 0, run
    assert run["held"] == run["plain"], run  # float32 bits, step by step
    assert run["same_weights"], run


def test_held_bytes_are_pinned_while_held_and_given_back(run: dict) -> None:
    assert run["in_use"]["bytes_active"] >= run["hold"], run
    assert run["in_use"]["bytes_in_use"] >= run["hold"], run
    assert run["in_use_after"] < run["hold"], run
    assert run["in_use_after_raise"] == run["in_use_after"], run
    assert run["in_use_after_errors"] == run["in_use_after"], run


def test_bad_holds_say_what_is_wrong(run: dict) -> None:
    errors = run["errors"]
    for name in ("zero", "bool"):
        assert errors[name].startswith("ValueError: hold_device_memory(num_bytes="), errors
        assert "positive whole number of bytes" in errors[name], errors
    too_many = f"cannot hold {run['device_bytes'] + 1} bytes of CPU:0, a device of " \
               f"{run['device_bytes']} bytes"
    assert errors["too_many"].startswith("ValueError: " + too_many), errors
    assert errors["no_room"].startswith(
        f"MemoryError: cannot hold {run['device_bytes']} bytes of CPU:0: out of device memory"), errors
