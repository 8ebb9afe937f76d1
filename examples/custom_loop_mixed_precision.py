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
    parser = support.example_parser(
        "Custom training loop (tf.function + GradientTape) with a Keras "
        "mixed-precision policy, under LMS.")
    parser.add_argument("--policy", choices=POLICIES, default="mixed_float16",
                        help="Keras dtype policy; mixed_float16 adds loss scaling")
    support.add_conv_arguments(parser)
    parser.add_argument("--steps", type=int, default=10,
                        help="training steps (the first includes tracing the graph)")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    return support.parse_arguments(parser, argv, device_memory_mb=64,
                                   minimums=(*support.CONV_MINIMUMS, ("steps", 1)))


def build_training_step(args: argparse.Namespace) -> tuple[Callable[[], Any], Any, Any]:
    """Returns (step, model, optimizer); step() trains one batch and returns the loss."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy(args.policy)
    keras.utils.set_random_seed(args.seed)
    inputs, x = support.conv_features(args.image_size, args.width, args.layers)
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
    device, lms = support.set_up_lms(args)  # before TensorFlow
    import tensorflow as tf

    setting = f"policy {args.policy}, {support.conv_setting(args, device)}"
    reporter: support.StepReporter | None = None
    try:
        train_step, model, optimizer = build_training_step(args)
        print(f"custom loop, {model.count_params():,} parameters; {setting}", flush=True)
        reporter = support.StepReporter(lms, args.steps, args.stats_csv)
        # Under mixed_float16 each step's line also shows the optimizer's loss scale.
        loss_scale = ((lambda: {"loss_scale": f"{float(optimizer.dynamic_scale):g}"})
                      if args.policy == "mixed_float16" else None)
        reporter.train(train_step, loss_scale)
    except tf.errors.ResourceExhaustedError as error:
        return support.report_out_of_memory(args, error, support.where_it_stopped(reporter),
                                            setting, reporter)
    support.print_trained(setting, args.steps, reporter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
