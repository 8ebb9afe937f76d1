"""Smallest emulated device on which real models still train with LMS, as a fraction of their peak.

For each model, one subprocess first trains it on a device far larger than it
needs (LMS on, nothing evicted) to measure its peak memory in use and its
step time; then a bisection finds the smallest device size (in MiB,
TF_LMS_CPU_DEVICE_MEMORY_MB) at which `--steps` training steps complete with
LMS on. Each probe is a fresh subprocess (TensorFlow creates its devices
once per process).

Models (synthetic data, SGD with momentum, keras.applications weights=None):
  resnet50      ResNet-50, 96x96x3 images, batch 32
  densenet121   DenseNet121, 64x64x3 images, batch 32
  transformer   4 encoder blocks (width 256, 4 heads, MLP 1024), sequence 256,
                batch 32, over a 1000-token embedding
  rnn           Embedding(10000, 128) -> LSTM(128) over the sequence -> GRU(128),
                sequence 121, batch 64: many kernels with small outputs (a GRU's
                TensorListFromTensor writes 121 of 32 KiB), which live in
                small-object pages
  mobilenetv2   MobileNetV2, 96x96x3 images, batch 32 (built for bench-policy;
                not among the models bisected here by default)

A probe "fits" when every step completes from device memory; an OOM, a crash,
a timeout, or a kernel's request placed in host memory because the device
could not hold it (num_overflow_placements) does not (its reason is printed). Near the limit a probe is not deterministic
(which kernels run at once, and so how much is pinned at once, varies), so the
bisection reports what it saw. Step times are medians of the steps after the
first (which traces the tf.function).

The floor: the uncapped probe records an access trace of its steps
(record_trace). The most bytes one kernel held pinned at once (its inputs,
outputs and temporaries, whole granules: replay.kernel_floor, with that
kernel's op) is what no smaller device can run from device memory, even with
kernels taking turns; the most all kernels held at once (replay.pinned_floor:
TensorFlow runs independent kernels concurrently) is printed beside it.
`min_cap_vs_floor` = smallest device that trains / the one-kernel floor: how
far LMS stays above the physical limit (between the two floors, the gap is
concurrency). `in pages` is the one-kernel floor with each kernel's small
objects in whole granules (replay.kernel_floor's small_in_pages): the floor of
any allocator that maps and evicts a granule at a time, as on a GPU; `min cap /
in pages` is how far LMS stays above that. `after 1st` is the smallest device probed
on which every step after the first ran from device memory. The first step traces
the tf.function: `rnn` at 14 MiB put two requests of its first step in host memory
and none of the steps after it, because tensors TensorFlow made outside kernels while
tracing keep their page from being evicted until a kernel first uses them (Note
[Writers outside kernels] in engine.h; benchmarks/README.md has the trace's account).

The last lines are `min_cap_fraction F`, the largest (worst) of the models'
minimum cap / peak, and `min_cap_vs_floor R`, the worst model's.

Example:
    make bench-mincap                                   # all three models
    .venv/bin/python benchmarks/mincap.py --models transformer --steps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from maxbatch import failure_reason, probe_environment  # noqa: E402
import probe_process  # noqa: E402
from probe_process import run_probe_process  # noqa: E402
from training_probe import train_and_time  # noqa: E402

MIB = 1 << 20
MODELS = ("resnet50", "densenet121", "transformer", "rnn")
# build_model also builds these, for other benchmarks (bench-policy).
OTHER_MODELS = ("mobilenetv2",)
UNCAPPED_MB = 16384
GRANULE_MB = 2


def build_model(name: str) -> tuple[Any, Any, Any]:
    """(model, inputs, labels) for one of MODELS, seeded."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    if name == "resnet50":
        model = keras.applications.ResNet50(weights=None, classes=10, input_shape=(96, 96, 3))
        inputs = tf.random.uniform((32, 96, 96, 3))
    elif name == "densenet121":
        model = keras.applications.DenseNet121(weights=None, classes=10,
                                               input_shape=(64, 64, 3))
        inputs = tf.random.uniform((32, 64, 64, 3))
    elif name == "mobilenetv2":
        model = keras.applications.MobileNetV2(weights=None, classes=10,
                                               input_shape=(96, 96, 3))
        inputs = tf.random.uniform((32, 96, 96, 3))
    elif name == "transformer":
        tokens = keras.Input((256,), dtype="int32")
        x = keras.layers.Embedding(1000, 256)(tokens)
        for _ in range(4):
            attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=64)(x, x)
            x = keras.layers.LayerNormalization()(x + attended)
            hidden = keras.layers.Dense(1024, activation="gelu")(x)
            x = keras.layers.LayerNormalization()(x + keras.layers.Dense(256)(hidden))
        outputs = keras.layers.Dense(10, activation="softmax")(
            keras.layers.GlobalAveragePooling1D()(x))
        model = keras.Model(tokens, outputs)
        inputs = tf.random.uniform((32, 256), maxval=1000, dtype=tf.int32)
    elif name == "rnn":
        tokens = keras.Input((121,), dtype="int32")
        x = keras.layers.Embedding(10000, 128)(tokens)
        x = keras.layers.LSTM(128, return_sequences=True)(x)
        x = keras.layers.GRU(128)(x)
        model = keras.Model(tokens, keras.layers.Dense(10, activation="softmax")(x))
        inputs = tf.random.uniform((64, 121), maxval=10000, dtype=tf.int32)
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    labels = tf.random.uniform((int(inputs.shape[0]),), maxval=10, dtype=tf.int32)
    return model, inputs, labels


# The probe's environment names a file for an access trace of its steps.
TRACE_ENV = "LMS_MINCAP_TRACE"


def run_probe_in_this_process(model_name: str, steps: int, result_path: Path) -> int:
    """Trains `steps` steps; writes {"step_seconds", "statistics",
    "overflows_in_first_step"} as JSON (and, where the environment's LMS_MINCAP_TRACE
    names a file, an access trace of the steps)."""
    import contextlib
    import os

    import tensorflow_lms_allocator as lms  # before tensorflow

    model, inputs, labels = build_model(model_name)
    trace_path = os.environ.get(TRACE_ENV)
    overflows_by_step: list[int] = []

    def count_overflows() -> None:
        overflows_by_step.append(lms.get_statistics(0)["num_overflow_placements"])

    with lms.record_trace(trace_path) if trace_path else contextlib.nullcontext():
        step_seconds = train_and_time(model, inputs, labels, steps, after_step=count_overflows)
    result_path.write_text(json.dumps({"step_seconds": step_seconds,
                                       "statistics": lms.get_statistics(0),
                                       "overflows_in_first_step": overflows_by_step[0]}))
    return 0


@dataclass
class Probe:
    """One probe subprocess: a model, a device size, and what happened."""

    cap_mb: int
    fits: bool
    reason: str = ""
    step_seconds: list[float] | None = None
    stats: dict[str, int] | None = None
    # Every step after the first (which traces the tf.function) ran from
    # device memory.
    later_steps_fit: bool = False

    @property
    def step_time(self) -> float:
        later = (self.step_seconds or [])[1:] or self.step_seconds or [float("nan")]
        return statistics.median(later)


def run_probe_script(script: Path, model_name: str, cap_mb: int, steps: int,
                     timeout: float, mode: str = "lms", settings: dict[str, str] | None = None
                     ) -> tuple[dict | None, str]:
    """Runs `script --probe` in a fresh process on a device of `cap_mb` (LMS on, or
    off with mode "lms-off"; `settings`, more variables of its environment): (its JSON result,
    "") or (None, why it failed). Shared with overhead.py."""
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, "-X", "faulthandler", str(script.resolve()),
                   "--probe", model_name, "--steps", str(steps), "--result", str(result_path)]
        env = {**probe_environment(mode, cap_mb, None), **(settings or {})}
        done = run_probe_process(command, env, timeout,
                                 f"{model_name} on {cap_mb} MiB"
                                 + (" with LMS off" if mode == "lms-off" else ""))
        if done.returncode == 0 and result_path.exists():
            return json.loads(result_path.read_text()), ""
        return None, failure_reason(done.returncode, done.stderr, done.timed_out, timeout)


def run_probe(model_name: str, cap_mb: int, steps: int, timeout: float,
              trace: Path | None = None) -> Probe:
    result, failed = run_probe_script(Path(__file__), model_name, cap_mb, steps, timeout,
                                      settings={TRACE_ENV: str(trace)} if trace else None)
    if result is None:
        return Probe(cap_mb, False, reason=failed)
    return judge(cap_mb, result)


def judge(cap_mb: int, result: dict[str, Any]) -> Probe:
    """A probe that trained, from its result: it fits only if no kernel's request was
    placed in host memory (slow on a GPU), and its later steps fit if none was after
    the first step.

    Example:
        judge(14, {"step_seconds": [2.8, 0.7], "overflows_in_first_step": 2,
                   "statistics": {"num_overflow_placements": 2}}).later_steps_fit  # True
    """
    overflows = result["statistics"]["num_overflow_placements"]
    later = overflows - result["overflows_in_first_step"]
    if overflows:
        where = (f"{later} after the first step" if later
                 else "all in the first step, none after it")
        return Probe(cap_mb, False, reason=f"{overflows} kernel requests placed in host "
                                           f"memory (num_overflow_placements; {where})",
                     later_steps_fit=later == 0)
    return Probe(cap_mb, True, step_seconds=result["step_seconds"], stats=result["statistics"],
                 later_steps_fit=True)


@dataclass
class Outcome:
    model: str
    peak_mb: float
    uncapped_step: float
    min_cap_mb: int
    min_cap_step: float
    probes: int
    floor_mb: float = float("nan")  # the most one kernel pins at once (whole granules)
    floor_op: str = ""  # that kernel's op
    at_once_mb: float = float("nan")  # the most all kernels pinned at once, uncapped
    page_floor_mb: float = float("nan")  # the floor with small objects in whole granules
    # The smallest device probed whose steps after the first all ran from
    # device memory: at most min_cap_mb.
    later_min_cap_mb: int = 0

    @property
    def fraction(self) -> float:
        return self.min_cap_mb / self.peak_mb

    @property
    def vs_floor(self) -> float:
        return self.min_cap_mb / self.floor_mb

    @property
    def later_vs_floor(self) -> float:
        return self.later_min_cap_mb / self.floor_mb


def floors_mb(trace_path: Path) -> tuple[float, str, float, float]:
    """A recorded trace's one-kernel floor (MiB) and its op, the most pinned at once,
    and the one-kernel floor with small objects in whole granules."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tensorflow_lms_allocator import replay, trace

    events = replay.normalize(trace.load(trace_path))
    floor, op = replay.kernel_floor(events, GRANULE_MB * MIB)
    at_once, _ = replay.pinned_floor(events, GRANULE_MB * MIB)
    in_pages, _ = replay.kernel_floor(events, GRANULE_MB * MIB, small_in_pages=True)
    return floor / MIB, op, at_once / MIB, in_pages / MIB


def measure(model_name: str, steps: int, resolution: float, timeout: float) -> Outcome:
    """The uncapped peak and floor, then the smallest fitting cap by bisection."""
    with tempfile.TemporaryDirectory(prefix="mincap-") as tmp:
        trace_path = Path(tmp) / f"{model_name}.lmstrace"
        uncapped = run_probe(model_name, UNCAPPED_MB, steps, timeout, trace=trace_path)
        if not uncapped.fits:
            raise RuntimeError(f"{model_name} does not train even on {UNCAPPED_MB} MiB: "
                               f"{uncapped.reason}")
        floor_mb, floor_op, at_once_mb, page_floor_mb = floors_mb(trace_path)
    assert uncapped.stats is not None
    peak_mb = uncapped.stats["peak_bytes_in_use"] / MIB
    print(f"{model_name}: peak {peak_mb:.0f} MiB in use, "
          f"step {uncapped.step_time:.2f} s uncapped; floor {floor_mb:.0f} MiB (one kernel: "
          f"{floor_op}; {page_floor_mb:.0f} MiB with small objects in whole granules), "
          f"{at_once_mb:.0f} MiB pinned at once by all", flush=True)
    # Device sizes are whole granules (TF_LMS_CPU_DEVICE_MEMORY_MB refuses others).
    fits_mb, fails_mb = -(-int(peak_mb + 1) // GRANULE_MB) * GRANULE_MB, 0
    best = None
    probes = 1
    later_mb = fits_mb  # every probe that fits counts here too: never above fits_mb
    step_mb = max(GRANULE_MB, int(peak_mb * resolution))
    while fits_mb - fails_mb > step_mb:
        cap = (fits_mb + fails_mb) // (2 * GRANULE_MB) * GRANULE_MB
        probe = run_probe(model_name, cap, steps, timeout)
        probes += 1
        if "TF_LMS_CPU_DEVICE_MEMORY_MB" in probe.reason:
            raise RuntimeError(f"the probe's setting was refused: {probe.reason}")
        verdict = "fits" if probe.fits else f"FAILS ({probe.reason[:150]})"
        print(f"  {model_name} at {cap} MiB ({cap / peak_mb:.2f} of peak): {verdict}",
              flush=True)
        if probe.fits:
            fits_mb, best = cap, probe
        else:
            fails_mb = cap
        if probe.later_steps_fit:
            later_mb = min(later_mb, cap)
    if best is None:  # even the first bisection step failed: the peak fits
        best = run_probe(model_name, fits_mb, steps, timeout)
        probes += 1
    return Outcome(model_name, peak_mb, uncapped.step_time, fits_mb, best.step_time, probes,
                   floor_mb, floor_op, at_once_mb, page_floor_mb, later_mb)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS + OTHER_MODELS,
                        default=list(MODELS))
    parser.add_argument("--steps", type=int, default=3, help="training steps per probe")
    parser.add_argument("--resolution", type=float, default=0.0,
                        help="stop bisecting when the interval is this fraction of the "
                             "peak or less (at least a granule, 2 MiB: the default)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per probe")
    parser.add_argument("--progress-every", type=float, default=30,
                        help="seconds between progress lines of a running probe")
    parser.add_argument("--probe", choices=MODELS + OTHER_MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return run_probe_in_this_process(args.probe, args.steps, args.result)
    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first traces), got {args.steps}")
    probe_process.progress_every = args.progress_every
    start = time.perf_counter()
    outcomes = [measure(m, args.steps, args.resolution, args.timeout) for m in args.models]
    print()
    print(f"  {'model':<12} {'peak':>9} {'min cap':>9} {'fraction':>9} "
          f"{'step uncapped':>14} {'step at min':>12} {'slowdown':>9} {'floor':>9} "
          f"{'at once':>9} {'min cap / floor':>16} {'in pages':>9} {'/ in pages':>11} "
          f"{'after 1st':>10}")
    for o in outcomes:
        print(f"  {o.model:<12} {o.peak_mb:>5.0f} MiB {o.min_cap_mb:>5} MiB "
              f"{o.fraction:>9.3f} {o.uncapped_step:>12.2f} s {o.min_cap_step:>10.2f} s "
              f"{o.min_cap_step / o.uncapped_step:>8.2f}x {o.floor_mb:>5.0f} MiB "
              f"{o.at_once_mb:>5.0f} MiB {o.vs_floor:>16.2f} {o.page_floor_mb:>5.0f} MiB "
              f"{o.min_cap_mb / o.page_floor_mb:>11.2f} {o.later_min_cap_mb:>6} MiB")
    print(f"  ({sum(o.probes for o in outcomes)} probes, "
          f"{(time.perf_counter() - start) / 60:.1f} min; targets: fraction <= 0.25, "
          f"min cap / floor <= 1.2)")
    worst = max(outcomes, key=lambda o: o.vs_floor)
    print(f"worst min cap / floor: {worst.model} (its floor: {worst.floor_op})")
    later = max(outcomes, key=lambda o: o.later_vs_floor)
    print(f"steps after the first from device memory, smallest device probed / floor: "
          f"worst {later.later_vs_floor:.2f} ({later.model}, {later.later_min_cap_mb} MiB)")
    print(f"min_cap_fraction {max(o.fraction for o in outcomes):.3f}")
    print(f"min_cap_vs_floor {worst.vs_floor:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
