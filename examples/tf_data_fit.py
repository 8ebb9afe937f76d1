"""A tf.data input pipeline feeding Keras model.fit, under LMS.

The pipeline is the usual one: a source (``--source tensors``:
``tf.data.Dataset.from_tensor_slices`` over in-memory arrays, or
``--source generator``: ``from_generator`` over a Python generator), then
``shuffle``, ``map`` (random flip and per-image standardisation, in parallel),
``batch``, ``repeat`` and ``prefetch``. A convolutional classifier trains on it
with ``model.fit``; a small Keras callback of this script prints one line per
batch (step i/N, elapsed, loss, what LMS evicted and paged in) and can write
the LMS statistics of each batch to ``--stats-csv``. The end prints the LMS
statistics and ``TRAINED: ...``.

Prefetched batches and the pipeline's buffers live in device memory too; LMS
treats them like any other tensor (evicted while they wait, paged in when
the training step reads them).

Without a GPU the CPU device runs as an emulated GPU with ``--device-memory-mb``
MiB, set as an environment variable before ``tensorflow_lms_allocator`` (then
TensorFlow) is imported; on a GPU the model runs on ``GPU:0`` and
``--device-memory-mb`` is ignored with a note.

Example:
    .venv/bin/python examples/tf_data_fit.py
    .venv/bin/python examples/tf_data_fit.py --source generator --epochs 2
    .venv/bin/python examples/tf_data_fit.py --no-lms       # out of memory, exit 3

Exit status: 0 when training finished, 3 on out of memory, 2 on bad
arguments, 1 if the package is not built.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Iterator, Sequence

import _example_support as support  # before TensorFlow: it sets the LMS environment

CLASSES = 10


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = support.example_parser(
        "Train a Keras model with model.fit on a tf.data pipeline "
        "(source, shuffle, map, batch, prefetch) under LMS.")
    parser.add_argument("--source", choices=("tensors", "generator"), default="tensors",
                        help="from_tensor_slices over arrays, or from_generator")
    parser.add_argument("--examples", type=int, default=256,
                        help="synthetic images in the data set")
    support.add_conv_arguments(parser)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps-per-epoch", type=int, default=8,
                        help="batches per epoch (the data set repeats)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    return support.parse_arguments(parser, argv, device_memory_mb=64, minimums=(
        ("examples", 1), *support.CONV_MINIMUMS, ("epochs", 1), ("steps_per_epoch", 1)))


def make_dataset(args: argparse.Namespace) -> Any:
    """The input pipeline: source, shuffle, map, batch, repeat, prefetch."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(args.seed)
    shape = (args.image_size, args.image_size, 3)
    images = rng.uniform(0, 255, (args.examples, *shape)).astype(np.float32)
    labels = rng.integers(0, CLASSES, args.examples).astype(np.int32)
    if args.source == "tensors":
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    else:
        def generate() -> Iterator[tuple[Any, Any]]:
            yield from zip(images, labels)

        dataset = tf.data.Dataset.from_generator(
            generate, output_signature=(tf.TensorSpec(shape, tf.float32),
                                        tf.TensorSpec((), tf.int32)))

    def augment(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        image = tf.image.random_flip_left_right(image)
        return tf.image.per_image_standardization(image), label

    return (dataset.shuffle(min(args.examples, 1024), seed=args.seed)
            .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(args.batch_size, drop_remainder=True)
            .repeat()
            .prefetch(tf.data.AUTOTUNE))


def make_model(args: argparse.Namespace) -> Any:
    import keras

    keras.utils.set_random_seed(args.seed)
    inputs, x = support.conv_features(args.image_size, args.width, args.layers)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES)(x))
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def progress_callback(reporter: support.StepReporter, steps_per_epoch: int) -> Any:
    """A Keras callback that reports every batch through `reporter`."""
    import keras

    class Progress(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            reporter.start()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            loss = float((logs or {}).get("loss", float("nan")))
            reporter.finish(self.epoch * steps_per_epoch + batch + 1, loss=f"{loss:8.4f}")

    return Progress()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device, lms = support.set_up_lms(args)  # before TensorFlow
    import tensorflow as tf

    setting = f"tf.data from {args.source}, {support.conv_setting(args, device)}"
    steps = args.epochs * args.steps_per_epoch
    reporter: support.StepReporter | None = None
    try:
        dataset = make_dataset(args)
        model = make_model(args)
        print(f"model.fit, {model.count_params():,} parameters; {setting}", flush=True)
        reporter = support.StepReporter(lms, steps, args.stats_csv)
        model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                  verbose=0, shuffle=False,  # the pipeline shuffles
                  callbacks=[progress_callback(reporter, args.steps_per_epoch)])
    except tf.errors.ResourceExhaustedError as error:
        return support.report_out_of_memory(args, error, support.where_it_stopped(reporter),
                                            setting, reporter)
    support.print_trained(setting, len(reporter.step_seconds), reporter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
