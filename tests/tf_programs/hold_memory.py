"""Trains a small convolutional model on the emulated device twice from the
same seed: once without pressure, once with its middle steps inside
tensorflow_lms_allocator.hold_device_memory (the device left with half the
model's peak), and prints ``RESULT <json>``: both runs' losses as bits, the
evictions of each phase, what the statistics said while the hold lasted,
and the errors of bad holds.

Usage: python hold_memory.py   (with TF_LMS_CPU_DEVICE_MEMORY_MB set)
"""

from __future__ import annotations

import json

import tensorflow_lms_allocator as lms  # before tensorflow
import numpy as np
import tensorflow as tf

from models import small_cnn

STEPS = 5  # one before the hold, three inside it, one after


def build() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(1)
    return small_cnn(conv_layers=6)


def evictions() -> int:
    return lms.get_statistics(0)["num_evictions"]


def error_of(num_bytes: object) -> str:
    try:
        with lms.hold_device_memory(num_bytes):  # type: ignore[arg-type]
            pass
    except (ValueError, MemoryError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def main() -> None:
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((8, 64, 64, 3), dtype=np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    device_bytes = lms.get_statistics(0)["bytes_limit"]

    model = build()
    plain = [float(model.train_on_batch(images, labels)) for _ in range(STEPS)]
    peak = lms.get_statistics(0)["peak_bytes_in_use"]
    plain_weights = [w.numpy() for w in model.weights]
    del model
    unpressed_evictions = evictions()

    granule = 2 << 20
    hold = device_bytes - peak // 2 // granule * granule
    model = build()

    def train(steps: int) -> list[float]:
        return [float(model.train_on_batch(images, labels)) for _ in range(steps)]

    held, phases = train(1), {}
    before = evictions()
    with lms.hold_device_memory(hold):
        in_use = {k: lms.get_statistics(0)[k] for k in ("bytes_in_use", "bytes_active")}
        phases["taking"] = evictions() - before
        before = evictions()
        held += train(3)
        phases["held"] = evictions() - before
    before = evictions()
    held += train(1)
    phases["after"] = evictions() - before
    after_in_use = lms.get_statistics(0)["bytes_in_use"]
    same_weights = all(np.array_equal(a, w.numpy()) for a, w in zip(plain_weights, model.weights))

    # Given back when the block raises, too.
    try:
        with lms.hold_device_memory(hold):
            raise KeyError("inside")
    except KeyError:
        pass
    print("RESULT " + json.dumps({
        "device_bytes": device_bytes, "peak": peak, "hold": hold,
        "unpressed_evictions": unpressed_evictions, "phases": phases, "in_use": in_use,
        "in_use_after": after_in_use,
        "in_use_after_raise": lms.get_statistics(0)["bytes_in_use"],
        "plain": [np.float32(v).view(np.uint32).item() for v in plain],
        "held": [np.float32(v).view(np.uint32).item() for v in held],
        "same_weights": same_weights,
        "errors": {"zero": error_of(0), "bool": error_of(True),
                   "too_many": error_of(device_bytes + 1),
                   "no_room": error_of(device_bytes)},
        "in_use_after_errors": lms.get_statistics(0)["bytes_in_use"],
    }), flush=True)


if __name__ == "__main__":
    main()
