"""What a benchmark's probe subprocess runs: training steps, timed, and the ResNet-50 probe.

The benchmarks measure in fresh processes (`probe_process.run_probe_process`
starts them); inside one, a Keras model trains a few steps of SGD with
momentum, each step a ``tf.function`` call, and the step times (and LMS
statistics) go back to the parent as JSON. `make_train_step` and
`train_and_time` are that training for any model (mincap.py, overhead.py,
overhead_paired.py); `run_resnet50_probe` is the ResNet-50 probe of
maxbatch.py and gpu_check.py: keras.applications ResNet-50 (weights=None, 10
classes) on one synthetic batch, the training step of examples/resnet50_lms.py.

Importing this module imports neither TensorFlow nor the LMS package: a probe
imports ``tensorflow_lms_allocator`` (or not, for stock TensorFlow) before it
calls these.

Example:
    import tensorflow_lms_allocator as lms  # before tensorflow
    from training_probe import run_resnet50_probe
    run_resnet50_probe(batch=32, steps=3, image_size=96, result_path=Path("r.json"),
                       lms=lms)
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable


def make_train_step(model: Any, inputs: Any, labels: Any) -> Callable[[], Any]:
    """One training step (SGD with momentum) as a tf.function; it returns the loss.

    Example:
        step = make_train_step(model, images, labels); float(step())
    """
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.SGD(learning_rate=0.001, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def train_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(inputs, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step


def train_and_time(model: Any, inputs: Any, labels: Any, steps: int,
                   after_step: Callable[[], None] | None = None) -> list[float]:
    """Trains `steps` steps (make_train_step's); their seconds.
    `after_step`, if given, runs after each step, outside its time.

    Example:
        seconds = train_and_time(model, images, labels, steps=3)  # [trace, step, step]
    """
    train_step = make_train_step(model, inputs, labels)
    step_seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        float(train_step())
        step_seconds.append(time.perf_counter() - start)
        if after_step is not None:
            after_step()
    return step_seconds


def run_resnet50_probe(batch: int, steps: int, image_size: int, result_path: Path,
                       lms: ModuleType | None, device: str | None = None) -> int:
    """Trains ResNet-50 `steps` steps; writes {"step_seconds", "statistics"} as JSON.

    The model, seeded with 0, trains on one synthetic batch of `batch`
    `image_size` x `image_size` images. With `lms` (the imported
    ``tensorflow_lms_allocator``) the result holds the LMS statistics of
    `device`, or of LMS device 0 when `device` is None; without it (stock
    TensorFlow) it has no "statistics". `device` ("GPU:0") also places the
    model and data there; None leaves placement to TensorFlow. Returns the
    probe's exit status, 0.

    Example:
        run_resnet50_probe(64, 5, 224, Path("result.json"), lms, device="GPU:0")
    """
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    with tf.device(f"/{device}") if device else contextlib.nullcontext():
        model = keras.applications.ResNet50(weights=None, classes=10,
                                            input_shape=(image_size, image_size, 3))
        images = tf.random.uniform((batch, image_size, image_size, 3))
        labels = tf.random.uniform((batch,), maxval=10, dtype=tf.int32)
        step_seconds = train_and_time(model, images, labels, steps)
    result: dict[str, Any] = {"step_seconds": step_seconds}
    if lms is not None:
        result["statistics"] = lms.get_statistics(device if device else 0)
    result_path.write_text(json.dumps(result))
    return 0
