"""A tf.compat.v1 graph trained in a MonitoredTrainingSession, under LMS.

For code that still builds a graph and runs it in a Session: eager execution
is turned off, the model is built from placeholders and variables
(``tf.compat.v1.get_variable``, ``tf.nn.conv2d``), trained with
``tf.compat.v1.train.MomentumOptimizer`` in a
``tf.compat.v1.train.MonitoredTrainingSession`` that stops at ``--steps``
(``StopAtStepHook``), fed a synthetic batch through ``feed_dict`` each step.

How LMS is turned on for a Session:

- with this package over a stock TensorFlow wheel (the overlay), LMS is a
  process setting: ``TF_LMS_ENABLED=1`` before import, or
  ``tf.config.experimental.set_lms_enabled(True)`` before the first Session
  creates the devices. This script sets ``TF_LMS_ENABLED`` from ``--lms``.
- with TensorFlow built from the source patch, ``ConfigProto`` also has
  ``gpu_options.experimental.lms_enabled``; the script sets it when the field
  exists, so the same code runs on both.

Each step prints a progress line (step i/N, elapsed, loss, what LMS evicted and
paged in); every ``--stats-every`` steps and at the end it prints the LMS
statistics. The last line is ``TRAINED: ...`` (or ``DOES NOT FIT: ...`` with
exit status 3 when it runs out of memory).

Without a GPU the CPU device runs as an emulated GPU with ``--device-memory-mb``
MiB, set as an environment variable before ``tensorflow_lms_allocator`` (then
TensorFlow) is imported; on a GPU the graph runs on ``GPU:0`` and
``--device-memory-mb`` is ignored with a note.

Example:
    .venv/bin/python examples/session_graph.py
    .venv/bin/python examples/session_graph.py --steps 20 --stats-every 5
    .venv/bin/python examples/session_graph.py --no-lms        # out of memory, exit 3
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

import _example_support as support  # before TensorFlow: it sets the LMS environment

CLASSES = 10


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = support.example_parser(
        "Train a tf.compat.v1 graph (placeholders, variables, MonitoredTrainingSession) "
        "under LMS.")
    support.add_conv_arguments(parser)
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--stats-every", type=int, default=5,
                        help="print the LMS statistics every this many steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    return support.parse_arguments(parser, argv, device_memory_mb=64, minimums=(
        *support.CONV_MINIMUMS, ("steps", 1), ("stats_every", 1)))


def build_graph(args: argparse.Namespace) -> dict[str, Any]:
    """The training graph: placeholders, loss and train op (in the default graph)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.set_random_seed(args.seed)
    images = v1.placeholder(tf.float32, (None, args.image_size, args.image_size, 3), "images")
    labels = v1.placeholder(tf.int32, (None,), "labels")
    x = images
    channels = 3
    for i in range(args.layers):
        kernel = v1.get_variable(f"conv{i}/kernel", (3, 3, channels, args.width),
                                 initializer=v1.glorot_uniform_initializer())
        bias = v1.get_variable(f"conv{i}/bias", (args.width,), initializer=v1.zeros_initializer())
        x = tf.nn.relu(tf.nn.conv2d(x, kernel, strides=1, padding="SAME") + bias)
        channels = args.width
    pooled = tf.reduce_mean(x, axis=(1, 2))
    weights = v1.get_variable("dense/kernel", (channels, CLASSES),
                              initializer=v1.glorot_uniform_initializer())
    logits = tf.matmul(pooled, weights)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    global_step = v1.train.get_or_create_global_step()
    train_op = v1.train.MomentumOptimizer(0.01, momentum=0.9).minimize(
        loss, global_step=global_step)
    return {"images": images, "labels": labels, "loss": loss, "train_op": train_op}


def session_config() -> Any:
    """A ConfigProto with LMS on where TensorFlow has the field (the source patch)."""
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    experimental = config.gpu_options.experimental
    if "lms_enabled" in experimental.DESCRIPTOR.fields_by_name:
        experimental.lms_enabled = True  # patched build; the overlay reads TF_LMS_ENABLED
    return config


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device, lms = support.set_up_lms(args)  # before TensorFlow
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    setting = support.conv_setting(args, device)
    graph = build_graph(args)
    rng = np.random.default_rng(args.seed)
    feed = {graph["images"]: rng.standard_normal(
                (args.batch_size, args.image_size, args.image_size, 3), dtype=np.float32),
            graph["labels"]: rng.integers(0, CLASSES, args.batch_size).astype(np.int32)}
    print(f"tf.compat.v1 graph, MonitoredTrainingSession; {setting}", flush=True)
    step = 0
    reporter: support.StepReporter | None = None
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps)]
    try:
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=hooks, config=session_config(), log_step_count_steps=None,
                save_summaries_steps=None, save_summaries_secs=None) as session:
            reporter = support.StepReporter(lms, args.steps, args.stats_csv)
            while not session.should_stop():
                step += 1
                reporter.start()
                _, loss = session.run([graph["train_op"], graph["loss"]], feed_dict=feed)
                reporter.finish(step, loss=f"{loss:8.4f}")
                if step % args.stats_every == 0 and step < args.steps:
                    support.print_statistics(lms.get_statistics(support.DEVICE),
                                             reporter.median_step_seconds())
    except tf.errors.ResourceExhaustedError as error:
        return support.report_out_of_memory(args, error, f"in step {step}", setting,
                                            reporter)
    assert reporter is not None
    support.print_trained(setting, step, reporter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
