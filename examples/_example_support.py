"""What the runnable examples share: device flags, progress lines, statistics, OOM exits.

Not an example itself. Each example in this directory imports it (the
directory of a running script is first on ``sys.path``) *before* TensorFlow,
because the LMS settings are environment variables that
``tensorflow_lms_allocator`` reads when it is imported:

1. ``parse_arguments(parser, argv, device_memory_mb, minimums)`` adds
   ``--lms/--no-lms``, ``--device-memory-mb``, ``--host-memory-mb`` and
   ``--stats-csv`` (`add_lms_arguments`), parses and checks them;
2. ``set_up_lms(args)`` turns them into ``TF_LMS_ENABLED``,
   ``TF_LMS_CPU_DEVICE_MEMORY_MB`` and ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` in
   ``os.environ`` (`configure_environment`; no re-exec is needed: nothing has
   imported TensorFlow yet), then imports the package (`import_lms`); then the
   example imports TensorFlow.

On a machine with an NVIDIA GPU (``/proc/driver/nvidia/gpus`` lists one) the
emulated device is not created: ``--device-memory-mb`` is ignored with a note,
the model runs on ``GPU:0`` with all of its memory, and statistics are read
from ``GPU:0`` (index 0 of ``tensorflow_lms_allocator.device_names()`` in both
cases). ``--force-emulated-device`` creates the emulated device anyway and
hides the GPUs from TensorFlow (``CUDA_VISIBLE_DEVICES=``), so the model runs
on it.

Example:
    import _example_support as support
    parser = support.example_parser("Trains a model under LMS.")
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    args = support.parse_arguments(parser, None, device_memory_mb=64,
                                   minimums=(("steps", 1),))
    device, lms = support.set_up_lms(args)  # before TensorFlow
    import tensorflow as tf
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Callable, Sequence

MIB = 1 << 20
EXIT_OUT_OF_MEMORY = 3  # every example's exit status on ResourceExhaustedError
EXIT_NOT_BUILT = 1
DEVICE = 0  # statistics device: the emulated CPU:0, or GPU:0 when there is no emulated device
# The minimums of add_conv_arguments' flags, for check_arguments.
CONV_MINIMUMS = (("batch_size", 1), ("image_size", 4), ("width", 1), ("layers", 1))


def gpu_present() -> bool:
    """True when the NVIDIA driver lists a GPU (checked without importing TensorFlow)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def example_parser(description: str) -> argparse.ArgumentParser:
    """The argument parser of an example: its `description`, each flag's default in --help.

    Example:
        parser = support.example_parser("Train a Keras model under LMS.")
    """
    return argparse.ArgumentParser(description=description,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def add_conv_arguments(parser: argparse.ArgumentParser, layers: int = 24,
                       batch_help: str = "images per step") -> None:
    """Adds the flags of the convolutional classifier (`conv_features`) on synthetic images:
    ``--batch-size``, ``--image-size``, ``--width`` and ``--layers`` (`layers` its default).

    Their minimums are `CONV_MINIMUMS`.

    Example:
        support.add_conv_arguments(parser, layers=16)
    """
    parser.add_argument("--batch-size", type=int, default=16, help=batch_help)
    parser.add_argument("--image-size", type=int, default=64,
                        help="height and width of the synthetic images")
    parser.add_argument("--width", type=int, default=16, help="channels of each convolution")
    parser.add_argument("--layers", type=int, default=layers, help="number of convolutions")


def add_memory_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                         device_memory_mb: int, device_help: str) -> None:
    """Adds ``--lms/--no-lms``, ``--device-memory-mb`` (`device_memory_mb` its
    default, `device_help` its help) and ``--host-memory-mb``.

    Example:
        support.add_memory_arguments(parser, 256, "device memory of the emulated GPU")
    """
    parser.add_argument("--lms", action=argparse.BooleanOptionalAction, default=True,
                        help="evict inactive tensors to host memory when device memory "
                             "runs out (sets TF_LMS_ENABLED)")
    parser.add_argument("--device-memory-mb", type=int, default=device_memory_mb,
                        help=device_help)
    parser.add_argument("--host-memory-mb", type=int, default=None,
                        help="host memory for evicted tensors in MiB, an even number (sets "
                             "TF_GPU_HOST_MEM_LIMIT_IN_MB; LMS's default is 65536)")


def add_lms_arguments(parser: argparse.ArgumentParser, device_memory_mb: int) -> None:
    """Adds the flags every example shares; `device_memory_mb` is the default cap."""
    group = parser.add_argument_group("LMS and device memory")
    add_memory_arguments(group, device_memory_mb,
                         "memory of the emulated device in MiB, an even number (sets "
                         "TF_LMS_CPU_DEVICE_MEMORY_MB); ignored with a note on a "
                         "machine with a GPU, which uses all of its memory")
    group.add_argument("--force-emulated-device", action="store_true",
                       help="create the emulated device even when a GPU is present "
                            "(hides the GPUs from TensorFlow)")
    group.add_argument("--stats-csv", type=Path, default=None,
                       help="write the LMS statistics after every step to this CSV file "
                            "(one row per step, flushed as it goes)")


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                    device_memory_mb: int, minimums: Sequence[tuple[str, int]],
                    output_files: Sequence[str] = ("stats_csv",)) -> argparse.Namespace:
    """Adds the LMS flags (`add_lms_arguments`) to `parser`, parses `argv` and
    checks the result (`check_arguments`); exits with a usage error if it is wrong.

    Example:
        args = support.parse_arguments(parser, argv, device_memory_mb=64,
                                       minimums=(*support.CONV_MINIMUMS, ("steps", 1)))
    """
    add_lms_arguments(parser, device_memory_mb)
    args = parser.parse_args(argv)
    check_arguments(parser, args, minimums, output_files)
    return args


def check_minimums(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   minimums: Sequence[tuple[str, int]]) -> None:
    """Exits with a usage error when a numeric flag is below its minimum.

    Example:
        support.check_minimums(parser, args, (("batch_size", 1), ("steps", 1)))
        # error: --batch-size must be at least 1, not 0
    """
    for name, minimum in minimums:
        value = getattr(args, name)
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be at least {minimum}, not {value}")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    minimums: Sequence[tuple[str, int]],
                    output_files: Sequence[str] = ("stats_csv",)) -> None:
    """Exits with a usage error when a numeric flag is below its minimum
    (`check_minimums`), ``--device-memory-mb`` or ``--host-memory-mb`` is not
    whole granules this machine has (`check_memory_mb`), or a flag named in
    `output_files` (by its attribute: ``stats_csv`` for ``--stats-csv``)
    cannot be written (`check_output_file`).

    Example:
        support.check_arguments(parser, args, (("batch_size", 1), ("steps", 1)))
    """
    check_minimums(parser, args, minimums)
    check_memory_mb(parser, "--device-memory-mb", args.device_memory_mb)
    check_memory_mb(parser, "--host-memory-mb", args.host_memory_mb)
    for name in output_files:
        check_output_file(parser, f"--{name.replace('_', '-')}", getattr(args, name))


def machine_memory_mb() -> int:
    """This machine's physical memory in MiB (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB
    except (ValueError, OSError):
        return 0


def check_memory_mb(parser: argparse.ArgumentParser, option: str, value: int | None) -> None:
    """Exits with a usage error unless `value` (MiB) is whole 2 MiB granules that
    fit this machine's memory, the rule LMS applies to its memory settings; None
    (unset) passes. The message offers the nearest valid values.

    Example:
        check_memory_mb(parser, "--host-memory-mb", 3)
        # error: --host-memory-mb 3: not whole 2 MiB granules (an even number of
        # MiB); use 2 or 4 (valid values: whole 2 MiB granules, 2 to <this machine's
        # memory> MiB, this machine's memory)
    """
    if value is None:
        return
    machine = machine_memory_mb()
    most = machine // 2 * 2 or None  # None: no known bound
    valid = ("valid values: whole 2 MiB granules, " + (
        f"2 to {most} MiB, this machine's memory" if most else "at least 2 MiB"))
    if value < 2:
        parser.error(f"{option} {value}: less than one 2 MiB granule; use 2 ({valid})")
    if most and value > most:
        parser.error(f"{option} {value}: more than this machine's memory ({machine} MiB); "
                     f"use at most {most} ({valid})")
    if value % 2:
        nearest = f"{value - 1} or {value + 1}" if not most or value + 1 <= most \
            else str(value - 1)
        parser.error(f"{option} {value}: not whole 2 MiB granules (an even number of "
                     f"MiB); use {nearest} ({valid})")


def check_output_file(parser: argparse.ArgumentParser, option: str,
                      path: Path | None) -> None:
    """Exits with a usage error unless `path` can be written as a file: not a
    directory, in a folder that exists and is writable. None (unset) passes.

    Checked with the arguments, so a bad path fails at once, not after training.

    Example:
        check_output_file(parser, "--stats-csv", Path("runs/missing/run.csv"))
        # error: --stats-csv runs/missing/run.csv: the folder runs/missing does not
        # exist; create it or name a file in an existing folder
    """
    if path is None:
        return
    folder = path.parent
    if path.is_dir():
        parser.error(f"{option} {path}: is a directory; name a file to write (in it, "
                     "for example)")
    if not folder.exists():
        parser.error(f"{option} {path}: the folder {folder} does not exist; create it or "
                     "name a file in an existing folder")
    if not folder.is_dir():
        parser.error(f"{option} {path}: {folder} is not a folder; name a file in an "
                     "existing folder")
    if not os.access(path if path.exists() else folder, os.W_OK):
        parser.error(f"{option} {path}: cannot be written (permission denied); name a "
                     "file you can write")


def configure_environment(args: argparse.Namespace) -> str:
    """Sets the LMS environment variables from `args`; returns the device description.

    Must run before ``import tensorflow_lms_allocator``, which reads them.
    """
    os.environ["TF_LMS_ENABLED"] = "1" if args.lms else "0"
    if args.host_memory_mb is not None:
        os.environ["TF_GPU_HOST_MEM_LIMIT_IN_MB"] = str(args.host_memory_mb)
    # TensorFlow's informational start-up lines would bury the progress lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    lms = f"LMS {'on' if args.lms else 'off'}"
    if gpu_present() and not args.force_emulated_device:
        os.environ.pop("TF_LMS_CPU_DEVICE_MEMORY_MB", None)
        print(f"note: a GPU is present, so --device-memory-mb {args.device_memory_mb} is "
              "ignored and the model runs on GPU:0 with all of its memory "
              "(--force-emulated-device to use the emulated device instead)", flush=True)
        return f"GPU:0, {lms}"
    if gpu_present():  # --force-emulated-device: ops would still be placed on GPU:0
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        print("note: --force-emulated-device hides the GPUs from TensorFlow "
              "(CUDA_VISIBLE_DEVICES=) so the model runs on the emulated device", flush=True)
    os.environ["TF_LMS_CPU_DEVICE_MEMORY_MB"] = str(args.device_memory_mb)
    return f"emulated device with {args.device_memory_mb} MiB, {lms}"


def import_lms() -> ModuleType:
    """Imports tensorflow_lms_allocator (before TensorFlow); exits 1 if it is not built."""
    try:
        import tensorflow_lms_allocator
    except ImportError as error:
        print(f"error: cannot load tensorflow_lms_allocator ({error}); run `make build` at "
              "the repository root and use its .venv/bin/python", file=sys.stderr)
        sys.exit(EXIT_NOT_BUILT)
    return tensorflow_lms_allocator


def set_up_lms(args: argparse.Namespace) -> tuple[str, ModuleType]:
    """Sets the LMS environment from `args` (`configure_environment`), then
    imports tensorflow_lms_allocator (`import_lms`): (the device description,
    the package). Call it before importing TensorFlow.

    Example:
        device, lms = support.set_up_lms(args)  # before TensorFlow
        import tensorflow as tf
    """
    device = configure_environment(args)
    return device, import_lms()


def conv_features(image_size: int, width: int, layers: int) -> tuple[Any, Any]:
    """(inputs, features) of the examples' convolutional classifier, without its head.

    `layers` 3x3 convolutions of `width` channels (ReLU) at full resolution
    over `image_size` x `image_size` RGB images, then global average pooling.

    Example:
        inputs, x = support.conv_features(args.image_size, args.width, args.layers)
        model = keras.Model(inputs, keras.layers.Dense(10)(x))
    """
    import keras

    inputs = keras.Input((image_size, image_size, 3))
    x = inputs
    for _ in range(layers):
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    return inputs, keras.layers.GlobalAveragePooling2D()(x)


def conv_setting(args: argparse.Namespace, device: str) -> str:
    """The convolutional classifier's setting in words, for the progress and verdict lines.

    Example:
        support.conv_setting(args, "emulated device with 64 MiB, LMS on")
        # 'batch 16, 64x64 images, 24 convolutions of 16 channels, emulated device ...'
    """
    return (f"batch {args.batch_size}, {args.image_size}x{args.image_size} images, "
            f"{args.layers} convolutions of {args.width} channels, {device}")


def applications_training_step(model_name: str, image_size: int, batch_size: int,
                               classes: int, seed: int) -> tuple[Callable[[], Any], Any]:
    """A keras.applications model, SGD with momentum, one synthetic batch: (step, model).

    The model `model_name` (``"ResNet50"``) is built with random weights
    (seeded with `seed`, like the data) for `classes` classes; calling step()
    runs one training step (a tf.function) and returns the loss. Raises
    AttributeError for a name keras.applications does not have and ValueError
    when the model cannot be built at that image size.

    Example:
        train_step, model = support.applications_training_step("ResNet50", 96, 32, 10, 0)
        loss = float(train_step())
    """
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)  # weights and data alike
    model = getattr(keras.applications, model_name)(
        weights=None, input_shape=(image_size, image_size, 3), classes=classes)
    optimizer = keras.optimizers.SGD(learning_rate=0.001, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    images = tf.random.uniform((batch_size, image_size, image_size, 3))
    labels = tf.random.uniform((batch_size,), maxval=classes, dtype=tf.int32)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return (lambda: train_step(images, labels)), model


def mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB"


class StepReporter:
    """Prints one progress line per step and keeps the LMS statistics of each.

    Each line says the step, the elapsed time, an estimate of the time left
    (the median step so far times the steps left), the step time, what LMS evicted
    and paged in during the step, and whatever the example passes (a loss).
    With a CSV path, every step's statistics are appended as a row and flushed,
    so a run that fails keeps the rows of the steps it finished.

    Example:
        reporter = StepReporter(lms, steps=10, csv_path=args.stats_csv)
        for step in range(1, 11):
            reporter.start()
            loss = float(train_step())
            reporter.finish(step, loss=f"{loss:.4f}")
        reporter.summary()
    """

    def __init__(self, lms: ModuleType, steps: int, csv_path: Path | None,
                 device: int | str = DEVICE) -> None:
        self._lms = lms
        self._device = device
        self.steps = steps
        self.step_seconds: list[float] = []
        self._begin = time.perf_counter()
        self._started = self._begin
        self._before = lms.get_statistics(device)
        self._csv_file: IO[str] | None = None
        self._csv: csv.DictWriter | None = None
        if csv_path is not None:  # its folder exists: check_output_file
            self._csv_file = csv_path.open("w", newline="")
            self._csv = csv.DictWriter(
                self._csv_file, fieldnames=["step", "step_seconds", *sorted(self._before)])
            self._csv.writeheader()
            self._csv_file.flush()

    def start(self) -> None:
        self._started = time.perf_counter()

    def finish(self, step: int, **values: str) -> dict[str, int]:
        """Ends `step`: prints its line, writes its CSV row; returns the statistics."""
        now = time.perf_counter()
        seconds = now - self._started
        self.step_seconds.append(seconds)
        after = self._lms.get_statistics(self._device)
        evicted = after["bytes_reclaimed"] - self._before["bytes_reclaimed"]
        paged_in = after["bytes_paged_in"] - self._before["bytes_paged_in"]
        shown = "".join(f"  {name} {value}" for name, value in values.items())
        # The first step traces the function; later steps predict the rest better.
        typical = statistics.median(self.step_seconds[1:] or self.step_seconds)
        print(f"step {step}/{self.steps}  elapsed {now - self._begin:6.1f} s  "
              f"left ~{typical * (self.steps - step):5.0f} s  "
              f"step {seconds:6.2f} s{shown}  evicted {mib(evicted):>11}  "
              f"paged in {mib(paged_in):>11}" + ("  (includes tracing)" if step == 1 else ""),
              flush=True)
        if self._csv is not None and self._csv_file is not None:
            self._csv.writerow({"step": step, "step_seconds": f"{seconds:.6f}", **after})
            self._csv_file.flush()
        self._before = after
        return after

    def train(self, train_step: Callable[[], Any],
              more: Callable[[], dict[str, str]] | None = None) -> None:
        """Runs `train_step` (which returns the loss) for each of the `steps`
        steps, with a line per step showing the loss and what `more` returns.

        Example:
            reporter.train(train_step, lambda: {"loss_scale": f"{scale():g}"})
        """
        for step in range(1, self.steps + 1):
            self.start()
            loss = float(train_step())
            self.finish(step, loss=f"{loss:8.4f}", **(more() if more else {}))

    def close(self) -> None:
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = None

    def median_step_seconds(self) -> float | None:
        """The median step time, without step 1 (tracing) when there are more."""
        times = self.step_seconds[1:] or self.step_seconds
        return statistics.median(times) if times else None

    def summary(self) -> dict[str, int]:
        """Prints the swap volume and peaks of the whole run; returns the statistics."""
        self.close()
        s = self._lms.get_statistics(self._device)
        print_statistics(s, self.median_step_seconds())
        return s


def print_statistics(s: dict[str, int], median_step_seconds: float | None) -> None:
    """Prints the LMS statistics a user reads first, one per line."""
    limit = s["bytes_limit"]
    rows = [
        ("device limit", mib(limit)),
        ("peak bytes in use", f"{mib(s['peak_bytes_in_use'])} "
                              f"({s['peak_bytes_in_use'] / max(limit, 1):.1f}x the limit)"),
        ("peak bytes active", mib(s["peak_bytes_active"])),
        ("bytes reclaimed (evicted)", f"{s['bytes_reclaimed']:,} bytes ({mib(s['bytes_reclaimed'])})"
                                      f" in {s['num_evictions']:,} evictions"),
        ("bytes paged in", f"{s['bytes_paged_in']:,} bytes ({mib(s['bytes_paged_in'])}) "
                           f"in {s['num_page_ins']:,} page-ins"),
        ("reclaims: single / full", f"{s['num_single_reclaims']:,} / {s['num_full_reclaims']:,}"),
        ("host memory peak", mib(s["host_peak_bytes_in_use"])),
    ]
    if median_step_seconds is not None:
        rows.append(("median step time", f"{median_step_seconds:.3f} s"))
    print(f"LMS statistics (device {DEVICE}):")
    for name, value in rows:
        print(f"  {name:<28} {value}")


def out_of_memory_reason(message: str) -> str:
    """The line of a ResourceExhaustedError that says what could not be allocated.

    TensorFlow's message opens with "Graph execution error:" and a Python stack;
    the allocator's reason is on the line "OOM when allocating tensor ...".
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("OOM when allocating"):
            return line.replace(" on /job:localhost/replica:0/task:0/device:", " on ")
    return lines[0] if lines else "ResourceExhaustedError"


def where_it_stopped(reporter: StepReporter | None) -> str:
    """Where training ran out of memory: "in step N", the step `reporter` was
    timing, or "while building the model" when there is no reporter yet.

    Example:
        support.where_it_stopped(None)  # 'while building the model'
    """
    if reporter is None:
        return "while building the model"
    return f"in step {len(reporter.step_seconds) + 1}"


def print_trained(setting: str, steps: int, reporter: StepReporter) -> None:
    """The examples' last line after training: steps, median step time, swap volume."""
    s = reporter.summary()
    print(f"TRAINED: {setting}: {steps} steps, median step "
          f"{reporter.median_step_seconds():.3f} s; {s['bytes_reclaimed']:,} bytes "
          f"reclaimed, {s['bytes_paged_in']:,} bytes paged in", flush=True)


def report_out_of_memory(args: argparse.Namespace, error: Any, where: str,
                         setting: str, reporter: StepReporter | None = None) -> int:
    """Prints one line saying what ran out and what to change; returns the exit status.

    `error` is a tf.errors.ResourceExhaustedError (its ``message``), `where`
    says when it happened ("in step 3"); `reporter`, if any, is closed first.
    """
    if reporter is not None:
        reporter.close()
    reason = out_of_memory_reason(getattr(error, "message", str(error)))
    advice = out_of_memory_advice(args, reason)
    print(f"DOES NOT FIT: out of memory {where} ({setting}); {advice}.", flush=True)
    print(f"error: out of memory {where}. TensorFlow: {reason}", file=sys.stderr, flush=True)
    return EXIT_OUT_OF_MEMORY


def out_of_memory_advice(args: argparse.Namespace, reason: str,
                         batch_size: str = "the batch size") -> str:
    """What to change after running out of memory for `reason` (`out_of_memory_reason`).

    `batch_size` names the setting that sets it (the flag, where it has one).

    Example:
        out_of_memory_advice(args, reason, batch_size="--batch-size")
        # 'turn LMS on (--lms), lower --batch-size or raise --device-memory-mb'
    """
    if "TF_GPU_HOST_MEM_LIMIT_IN_MB" in reason:
        return "raise --host-memory-mb (host memory for evicted tensors)"
    turn_on = "" if args.lms else "turn LMS on (--lms), "
    return f"{turn_on}lower {batch_size} or raise --device-memory-mb"
