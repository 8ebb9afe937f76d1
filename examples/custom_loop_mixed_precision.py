"""A custom training loop under tf.function with mixed precision, under LMS.

A convolutional classifier (``--layers`` 3x3 convolutions of ``--width``
channels at full resolution) trains on synthetic images with a hand-written
training step: ``tf.GradientTape`` inside a ``tf.function``, under a Keras
mixed-precision policy. Compute runs in 16-bit floats and the variables stay
float32; the logits are cast back to float32 before the loss.

- ``--policy mixed_float16`` (the default) wraps the optimizer in
  ``keras.optimizers.LossScaleOptimizer``: the loss is scaled before the
  gradient (``optimizer.scale_loss``) so small float16 gradients do not flush
  to zero, and ``apply_gradients`` unscales them and skips a step whose
  gradients are not finite. This is the policy for NVIDIA GPUs.
- ``--policy mixed_bfloat16`` needs no loss scaling: bfloat16 has float32's
  exponent range (the policy for TPUs and recent GPUs). TensorFlow's CPU
  kernels run both policies on the emulated device, but slowly: at the
  defaults a step took 0.37 s in float32, 0.87 s in mixed_float16 and 2.5 s
  in mixed_bfloat16 on two cores (Eigen emulates 16-bit arithmetic), so the
  emulated device shows what LMS moves, not the speed-up a GPU gets.

Every step prints its loss (and the loss scale under float16) and what LMS
evicted and paged in; the end prints the LMS statistics and a verdict line
``TRAINED: ...``. Activations in 16 bits take half the memory, so LMS has half
as much to move: compare ``--policy float32`` at the same cap.

Without a GPU the CPU device runs as an emulated GPU with ``--device-memory-mb``
MiB; the flags are set as environment variables before
``tensorflow_lms_allocator`` (then TensorFlow) is imported. On a GPU the model
runs on ``GPU:0`` and ``--device-memory-mb`` is ignored with a note.

Example:
    .venv/bin/python examples/custom_loop_mixed_precision.py
    .venv/bin/python examples/custom_loop_mixed_precision.py --policy mixed_bfloat16
    .venv/bin/python examples/custom_loop_mixed_precision.py --policy float32 --no-lms

Exit status: 0 when every step trained, 3 on out of memory, 2 on bad
arguments, 1 if the package is not built.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

import _example_support as support  # before TensorFlow: it sets the LMS environment

POLICIES = ("mixed_float16", "mixed_bfloat16", "float32")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Custom training loop (tf.function + GradientTape) with a Keras "
                    "mixed-precision policy, under LMS.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--policy", choices=POLICIES, default="mixed_float16",
                        help="Keras dtype policy; mixed_float16 adds loss scaling")
    parser.add_argument("--batch-size", type=int, default=16, help="images per step")
    parser.add_argument("--image-size", type=int, default=64,
                        help="height and width of the synthetic images")
    parser.add_argument("--width", type=int, default=16, help="channels of each convolution")
    parser.add_argument("--layers", type=int, default=24, help="number of convolutions")
    parser.add_argument("--steps", type=int, default=10,
                        help="training steps (the first includes tracing the graph)")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    support.add_lms_arguments(parser, device_memory_mb=64)
    args = parser.parse_args(argv)
    support.check_arguments(parser, args, (("batch_size", 1), ("image_size", 4),
                                           ("width", 1), ("layers", 1), ("steps", 1)))
    return args


def build_training_step(args: argparse.Namespace) -> tuple[Callable[[], Any], Any, Any]:
    """Returns (step, model, optimizer); step() trains one batch and returns the loss."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy(args.policy)
    keras.utils.set_random_seed(args.seed)
    inputs = keras.Input((args.image_size, args.image_size, 3))
    x = inputs
    for _ in range(args.layers):
        x = keras.layers.Conv2D(args.width, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(10)(x)
    # The loss in float32: a 16-bit softmax loses precision.
    logits = keras.layers.Activation("linear", dtype="float32")(x)
    model = keras.Model(inputs, logits)

    optimizer: Any = keras.optimizers.SGD(learning_rate=args.learning_rate, momentum=0.9)
    if args.policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    images = tf.random.uniform((args.batch_size, args.image_size, args.image_size, 3))
    labels = tf.random.uniform((args.batch_size,), maxval=10, dtype=tf.int32)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            if args.policy == "mixed_float16":
                scaled = optimizer.scale_loss(loss)
            else:
                scaled = loss
        gradients = tape.gradient(scaled, model.trainable_variables)
        # LossScaleOptimizer.apply_gradients unscales and skips non-finite steps.
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return (lambda: train_step(images, labels)), model, optimizer


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = support.configure_environment(args)
    lms = support.import_lms()
    import tensorflow as tf

    setting = (f"policy {args.policy}, batch {args.batch_size}, {args.image_size}x"
               f"{args.image_size} images, {args.layers} convolutions of {args.width} "
               f"channels, {device}")
    step = 0
    reporter: support.StepReporter | None = None
    try:
        train_step, model, optimizer = build_training_step(args)
        print(f"custom loop, {model.count_params():,} parameters; {setting}", flush=True)
        reporter = support.StepReporter(lms, args.steps, args.stats_csv)
        for step in range(1, args.steps + 1):
            reporter.start()
            loss = float(train_step())
            values = {"loss": f"{loss:8.4f}"}
            if args.policy == "mixed_float16":
                values["loss_scale"] = f"{float(optimizer.dynamic_scale):g}"
            reporter.finish(step, **values)
    except tf.errors.ResourceExhaustedError as error:
        where = f"in step {step}" if step else "while building the model"
        return support.report_out_of_memory(args, error, where, setting, reporter)
    support.print_trained(setting, args.steps, reporter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
