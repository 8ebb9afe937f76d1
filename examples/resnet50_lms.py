"""Trains Keras ResNet-50 on synthetic images under a device-memory cap, with LMS.

Without a GPU, the CPU device runs as an *emulated GPU* with
``--device-memory-mb`` MiB of device memory (``TF_LMS_CPU_DEVICE_MEMORY_MB``).
With LMS on, inactive tensors (forward activations waiting for the backward
pass) are evicted to host memory when that runs out and paged back in when a
kernel needs them, so a batch whose training step needs far more memory than
the cap still trains. With ``--no-lms`` the same cap is a plain limit and the
step fails with ``ResourceExhaustedError``.

The settings are environment variables that tensorflow_lms_allocator reads
when it is imported, so the script sets them first, then imports the package,
then TensorFlow. It prints one line per step (loss, step time, what LMS moved)
and a summary of the LMS statistics at the end.

Example:
    # batch 32 peaks at about 900 MiB in use; train it in 256 MiB of device memory
    .venv/bin/python examples/resnet50_lms.py --batch-size 32 --device-memory-mb 256
    # the same without LMS: exits with status 3 and a one-line out-of-memory error
    .venv/bin/python examples/resnet50_lms.py --batch-size 32 --device-memory-mb 256 --no-lms

Exit status: 0 when every step trained, 3 on out of memory (device, or host
memory for evicted tensors), 2 on bad arguments, 1 if the package is not built.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import _example_support as support  # examples/ is on sys.path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = support.example_parser(
        "Train Keras ResNet-50 on synthetic data under an emulated device-memory cap, "
        "with or without LMS.")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per training step")
    parser.add_argument("--steps", type=int, default=6,
                        help="training steps (the first includes tracing the graph)")
    parser.add_argument("--image-size", type=int, default=96,
                        help="height and width of the synthetic images (at least 32)")
    support.add_memory_arguments(parser, 256, "device memory of the emulated GPU, in MiB, "
                                 "an even number (sets TF_LMS_CPU_DEVICE_MEMORY_MB)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    parser.add_argument("--stats-json", type=Path, default=None,
                        help="also write the step times and LMS statistics to this "
                             "file as JSON (for scripts such as examples/demo.py)")
    args = parser.parse_args(argv)
    support.check_arguments(parser, args, (("batch_size", 1), ("steps", 1), ("image_size", 32)),
                            output_files=("stats_json",))
    return args


def configure_environment(args: argparse.Namespace) -> None:
    """Sets the LMS settings; they are read when the package is imported."""
    os.environ["TF_LMS_CPU_DEVICE_MEMORY_MB"] = str(args.device_memory_mb)
    os.environ["TF_LMS_ENABLED"] = "1" if args.lms else "0"
    if args.host_memory_mb is not None:
        os.environ["TF_GPU_HOST_MEM_LIMIT_IN_MB"] = str(args.host_memory_mb)
    # TensorFlow's informational start-up lines would bury the progress lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def mib(n: int) -> str:
    return f"{n / support.MIB:,.0f} MiB"


def train(args: argparse.Namespace) -> int:
    configure_environment(args)
    lms = support.import_lms()  # tensorflow_lms_allocator, before tensorflow: it wires LMS in
    import tensorflow as tf

    setting = (f"batch {args.batch_size}, {args.device_memory_mb} MiB device memory, "
               f"LMS {'on' if args.lms else 'off'}")
    step_seconds: list[float] = []
    step = 0  # 0 while the model is built
    try:
        # ResNet-50, SGD with momentum, one synthetic batch; step() trains on it.
        train_step, model = support.applications_training_step(
            "ResNet50", args.image_size, args.batch_size, classes=10, seed=args.seed)
        print(f"ResNet-50 ({model.count_params():,} parameters), {args.image_size}x"
              f"{args.image_size}x3 synthetic images; {setting}", flush=True)
        before = lms.get_statistics(0)
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            loss = float(train_step())
            seconds = time.perf_counter() - start
            step_seconds.append(seconds)
            after = lms.get_statistics(0)
            evicted = after["bytes_reclaimed"] - before["bytes_reclaimed"]
            paged_in = after["bytes_paged_in"] - before["bytes_paged_in"]
            print(f"step {step:3d}/{args.steps}  loss {loss:8.4f}  {seconds:6.2f} s  "
                  f"evicted {mib(evicted):>9}  paged in {mib(paged_in):>9}"
                  + ("  (includes tracing)" if step == 1 else ""), flush=True)
            before = after
    except tf.errors.ResourceExhaustedError as error:
        where = f"in step {step}" if step else "while building the model"
        reason = support.out_of_memory_reason(error.message)
        advice = support.out_of_memory_advice(args, reason, batch_size="--batch-size")
        print(f"error: out of memory {where} ({setting}); {advice}. "
              f"TensorFlow: {reason}", file=sys.stderr, flush=True)
        write_json(args, step_seconds, lms.get_statistics(0), failed=reason)
        return support.EXIT_OUT_OF_MEMORY
    final = lms.get_statistics(0)
    print_summary(final, step_seconds)
    write_json(args, step_seconds, final, failed=None)
    return 0


def print_summary(s: dict[str, int], step_seconds: list[float]) -> None:
    limit = s["bytes_limit"]
    rows = [
        ("peak bytes in use", f"{mib(s['peak_bytes_in_use'])} "
                              f"({s['peak_bytes_in_use'] / limit:.1f}x the device limit "
                              f"of {mib(limit)})"),
        ("peak bytes active (pinned + small)", mib(s["peak_bytes_active"])),
        ("bytes reclaimed (evicted)", f"{mib(s['bytes_reclaimed'])} in "
                                      f"{s['num_evictions']:,} evictions"),
        ("reclaims: single / full", f"{s['num_single_reclaims']:,} / "
                                    f"{s['num_full_reclaims']:,}"),
        ("page-ins", f"{s['num_page_ins']:,} ({mib(s['bytes_paged_in'])})"),
        ("host memory peak", mib(s["host_peak_bytes_in_use"])),
        ("defragmentations", f"{s['num_defragmentations']:,} "
                             f"({mib(s['bytes_defragged'])} remapped)"),
    ]
    if len(step_seconds) > 1:
        rows.append(("median step time after step 1",
                     f"{statistics.median(step_seconds[1:]):.2f} s"))
    print("LMS statistics (device 0):")
    for name, value in rows:
        print(f"  {name:<36} {value}")


def write_json(args: argparse.Namespace, step_seconds: list[float],
               stats: dict[str, int], failed: str | None) -> None:
    if args.stats_json is None:
        return
    result: dict[str, Any] = {"batch_size": args.batch_size, "lms": args.lms,
                              "device_memory_mb": args.device_memory_mb,
                              "step_seconds": step_seconds, "statistics": stats,
                              "out_of_memory": failed}
    args.stats_json.write_text(json.dumps(result, indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
