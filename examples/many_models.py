"""How far can a keras.applications model be pushed? Train it a few steps and see if it fits.

IBM's TensorFlow LMS shipped a "ManyModel" example for finding the largest
image size or batch a model trains at with LMS; this is that idea for any model
in ``keras.applications`` (ResNet50, DenseNet121, MobileNetV2, VGG16,
EfficientNetB0, ...), built with random weights (``weights=None``) and trained
on synthetic images with SGD + momentum, one step per ``tf.function`` call.

It prints one line per step (step i/N, elapsed, step time, loss, what LMS
evicted and paged in), the LMS statistics, and a verdict line:

    FITS: ResNet50, batch 32, 96x96 images, ...: median step 1.52 s, ...
    DOES NOT FIT: out of memory in step 1 (...); turn LMS on (--lms), ...

Without a GPU, the CPU device runs as an emulated GPU with
``--device-memory-mb`` MiB of memory; the flags become environment variables
before ``tensorflow_lms_allocator`` (then TensorFlow) is imported, so no
re-exec is needed. On a machine with a GPU the model runs on ``GPU:0`` with all
of its memory and ``--device-memory-mb`` is ignored with a note.

Example:
    .venv/bin/python examples/many_models.py                       # ResNet50, batch 32, 256 MiB
    .venv/bin/python examples/many_models.py --model DenseNet121 --batch-size 16
    .venv/bin/python examples/many_models.py --model VGG16 --image-size 64 --no-lms
    .venv/bin/python examples/many_models.py --model MobileNetV2 --stats-csv run.csv

Exit status: 0 when every step trained, 3 when it did not fit (out of device
memory, or of host memory for evicted tensors), 2 on bad arguments or a model
keras.applications does not have or cannot build at that size, 1 if the
package is not built.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

import _example_support as support  # before TensorFlow: it sets the LMS environment

EXIT_BAD_MODEL = 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = support.example_parser(
        "Train a keras.applications model a few steps on synthetic images "
        "under a device-memory cap and report whether it fit.")
    parser.add_argument("--model", default="ResNet50",
                        help="a keras.applications model name (ResNet50, DenseNet121, "
                             "MobileNetV2, VGG16, EfficientNetB0, ...)")
    parser.add_argument("--image-size", type=int, default=96,
                        help="height and width of the synthetic images (most models "
                             "need at least 32)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per step")
    parser.add_argument("--steps", type=int, default=6,
                        help="training steps (the first includes tracing the graph)")
    parser.add_argument("--classes", type=int, default=10, help="classes of the classifier")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    return support.parse_arguments(parser, argv, device_memory_mb=256, minimums=(
        ("image_size", 1), ("batch_size", 1), ("steps", 1), ("classes", 2)))


def model_names(applications: Any) -> list[str]:
    """The model constructors keras.applications has (capitalised callables)."""
    return sorted(name for name in dir(applications)
                  if name[:1].isupper() and callable(getattr(applications, name)))


def build_training_step(args: argparse.Namespace) -> tuple[Callable[[], Any], Any]:
    """The model and one synthetic batch; returns (step, model).

    Raises LookupError for a name keras.applications does not have, and
    ValueError when the model cannot be built at that image size.
    """
    import keras

    names = model_names(keras.applications)
    if args.model not in names:
        close = [n for n in names if n.lower().startswith(args.model.lower()[:3])]
        some = close or ["ResNet50", "DenseNet121", "MobileNetV2", "VGG16", "EfficientNetB0",
                         "InceptionV3", "Xception", "ConvNeXtTiny"]
        raise LookupError(f"keras.applications has no model {args.model!r} (names are "
                          f"case-sensitive); try one of: {', '.join(some)} "
                          f"({len(names)} in all)")
    return support.applications_training_step(args.model, args.image_size, args.batch_size,
                                              args.classes, args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device, lms = support.set_up_lms(args)  # before TensorFlow
    import tensorflow as tf

    setting = (f"{args.model}, batch {args.batch_size}, {args.image_size}x{args.image_size} "
               f"images, {device}")
    reporter: support.StepReporter | None = None
    try:
        try:
            train_step, model = build_training_step(args)
        except LookupError as error:
            print(f"error: {error.args[0]}", file=sys.stderr)
            return EXIT_BAD_MODEL
        except ValueError as error:
            print(f"error: cannot build {args.model} for {args.image_size}x"
                  f"{args.image_size} images: {error}; try another --image-size",
                  file=sys.stderr)
            return EXIT_BAD_MODEL
        print(f"{args.model} ({model.count_params():,} parameters); {setting}", flush=True)
        reporter = support.StepReporter(lms, args.steps, args.stats_csv)
        reporter.train(train_step)
    except tf.errors.ResourceExhaustedError as error:
        return support.report_out_of_memory(args, error, support.where_it_stopped(reporter),
                                            setting, reporter)
    s = reporter.summary()
    median = reporter.median_step_seconds()
    print(f"FITS: {setting}: {args.steps} steps, median step {median:.3f} s; swapped "
          f"{s['bytes_reclaimed']:,} bytes out (reclaimed), {s['bytes_paged_in']:,} bytes "
          f"paged in; peak in use {support.mib(s['peak_bytes_in_use'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
