"""Keras callbacks (and a tf.compat.v1 session hook) that record what LMS does.

Each reads the LMS statistics of one device (``get_statistics``) at the end of
training steps and writes them somewhere a person or a tool can read:

- `LMSStatsLogger`: a CSV row per step (every statistic, or the ones you
  name), flushed per row so a crashed run keeps what it logged;
- `LMSStatsAverage`: per-step averages and totals of the swap statistics over
  a range of steps, as one JSON document, for comparing runs;
- `LMSStatsTensorBoard`: every statistic as a TensorBoard scalar
  ``lms/<statistic>`` at the global step;
- `LMSStatsSessionHook`: the CSV of `LMSStatsLogger` for
  ``tf.compat.v1.train.MonitoredTrainingSession`` users.

``python stats_tools/lms_stats.py plot|summary RUN.csv`` draws and summarises
the CSV.

Statistics use the engine's names (``bytes_reclaimed``, ``num_page_ins``, ...,
``tensorflow_lms_allocator.engine.STATISTICS`` documents each); the public
getter names (``get_bytes_reclaimed``) are accepted too. Cumulative counters
(``bytes_reclaimed``, ``num_page_ins``, ``num_evictions``, ...) only grow;
levels (``bytes_in_use``, ``bytes_active``, ...) are the device's state when
the step ended, after its kernels released their tensors.

Under ``model.compile(..., steps_per_execution=N)`` Keras runs N steps per
call of its training function and calls the callbacks once per call: the
Keras callbacks then write one row (scalar, range entry) per execution,
numbered by the execution's last step, since statistics cannot be read
between the steps of one execution.

Example:
    >>> import tensorflow_lms_allocator  # before tensorflow
    >>> import tensorflow as tf
    >>> from tensorflow_lms_allocator.callbacks import LMSStatsLogger
    >>> model.fit(x, y, callbacks=[LMSStatsLogger("lms.csv")])  # doctest: +SKIP

The device is checked when a callback is made, so a callback made before
TensorFlow created its devices creates them: enable LMS first.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import os
import time
from collections.abc import Iterable, Sequence
from typing import IO, Any

import tensorflow as tf

from tensorflow_lms_allocator import lms

# The columns every CSV row starts with, before the statistics.
#   epoch        Keras epoch (0-based); 0 for the session hook
#   batch        batch within the epoch (0-based); the run call for the hook
#   step         steps trained before this one in this run (0-based, across epochs)
#   step_time_s  wall time of the step in seconds (batch begin to batch end)
# With steps_per_execution=N > 1 a row is one execution of N steps: batch and
# step are its last step's, step_time_s is the whole execution's.
CSV_LEADING_COLUMNS: tuple[str, ...] = ("epoch", "batch", "step", "step_time_s")

# The swap statistics LMSStatsAverage reports: cumulative counters, so a
# step's share is the counter's growth during it.
SWAP_COUNTERS: tuple[str, ...] = ("bytes_reclaimed", "num_single_reclaims",
                                  "num_full_reclaims", "num_evictions", "num_page_ins",
                                  "bytes_paged_in", "bytes_copied_out", "bytes_copied_in")


def statistic_names() -> list[str]:
    """Every statistic LMS keeps, in the engine's order (the CSV's column order).

    ``tensorflow_lms_allocator.engine.STATISTICS`` maps each to its doc.

    Example:
        >>> statistic_names()[:3]  # doctest: +SKIP
        ['num_allocs', 'bytes_in_use', 'peak_bytes_in_use']
    """
    from tensorflow_lms_allocator.engine import STATISTICS

    return list(STATISTICS)


def _select_statistics(statistics: Iterable[str] | None) -> list[str]:
    """The engine names `statistics` asks for (all of them for None), checked.

    Example:
        >>> _select_statistics(["get_bytes_reclaimed", "num_page_ins"])  # doctest: +SKIP
        ['bytes_reclaimed', 'num_page_ins']
    """
    known = statistic_names()
    if statistics is None:
        return known
    if isinstance(statistics, (str, bytes)):
        raise TypeError(f"statistics takes a list of names like ['bytes_reclaimed'], "
                        f"not the string {statistics!r}")
    chosen: list[str] = []
    for name in statistics:
        engine_name = lms.STATISTICS.get(name, name)
        if engine_name not in known:
            raise ValueError(f"statistics: unknown statistic {name!r}; valid names are "
                             f"{', '.join(known)} (or their getter names, "
                             "get_bytes_reclaimed, ...)")
        if engine_name not in chosen:
            chosen.append(engine_name)
    if not chosen:
        raise ValueError("statistics: the list is empty; leave it None for every statistic "
                         "or name at least one")
    return chosen


def _check_every(argument: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{argument} must be a whole number >= 1 (log every Nth step), "
                         f"not {value!r}")
    return int(value)


def _check_device(device: Any) -> str:
    """The LMS device `device` names, or a ValueError naming the argument.

    Reads the device's statistics once, so a device that exists but has no
    LMS allocator is refused here rather than at the first step.

    Example:
        >>> _check_device(0)  # doctest: +SKIP
        'CPU:0'
    """
    try:
        name = lms._device_name(device)
        lms.get_statistics(name)
    except (ValueError, TypeError, RuntimeError, LookupError) as error:
        raise ValueError(f"device={device!r} has no LMS statistics: {error}") from error
    return name


class _StepCounter:
    """Numbers training steps across epochs from the batch indices Keras passes.

    Keras calls ``on_train_batch_begin(first)`` and ``on_train_batch_end(last)``
    once per execution of its training function: with steps_per_execution=N
    an execution runs the epoch's steps first..last (N of them; batch indices
    restart at 0 every epoch), with N=1 first == last.

    Example:
        >>> steps = _StepCounter()
        >>> steps.begin(0); steps.end(3)  # steps_per_execution=4
        (0, 3)
        >>> steps.begin(0); steps.end(3)  # the next epoch
        (4, 7)
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.trained = 0  # steps that ended in this run
        self._first: int | None = None

    def begin(self, batch: int) -> None:
        self._first = batch

    def end(self, batch: int) -> tuple[int, int]:
        """(first, last) step of the run (0-based) in the execution that ended."""
        first_batch = self._first if self._first is not None else batch
        count = max(batch - first_batch + 1, 1)
        first = self.trained
        self.trained += count
        self._first = None
        return first, self.trained - 1


def _holds_multiple(first: int, last: int, every: int) -> bool:
    """Whether a step of first..last is a multiple of `every` (what is logged)."""
    return last // every * every >= first


class StatsCsvWriter:
    """Writes LMS statistics rows to a CSV file: a header, then one flushed row per call.

    The file is created (truncated) when the writer is made, with the header
    ``epoch,batch,step,step_time_s,<statistics...>``. `LMSStatsLogger` and
    `LMSStatsSessionHook` write through it.

    Example:
        >>> writer = StatsCsvWriter("lms.csv", ["bytes_reclaimed"])  # doctest: +SKIP
        >>> writer.write_row(0, 0, 0, 0.25, {"bytes_reclaimed": 4194304})  # doctest: +SKIP
        >>> writer.close()  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str], statistics: Sequence[str]) -> None:
        self.path = os.fspath(path)
        self.statistics = list(statistics)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "w", newline="")
        self._csv = csv.writer(self._file)
        self._csv.writerow([*CSV_LEADING_COLUMNS, *self.statistics])
        self._file.flush()

    def write_row(self, epoch: int, batch: int, step: int, step_time_s: float,
                  values: dict[str, int]) -> None:
        """Appends one row and flushes it to the operating system."""
        if self._file is None:
            raise ValueError(f"the CSV writer of {self.path} is closed")
        self._csv.writerow([epoch, batch, step, f"{step_time_s:.6f}",
                            *(values[name] for name in self.statistics)])
        self._file.flush()

    def close(self) -> None:
        """Closes the file; later rows are an error. Closing twice is harmless."""
        if self._file is not None:
            self._file.close()
            self._file = None


class _TimedSteps(tf.keras.callbacks.Callback):
    """A Keras callback that numbers and times each execution of the training function.

    ``on_train_batch_begin`` starts the clock; ``on_train_batch_end`` hands the
    execution's first and last step (`_StepCounter`) and its wall time in
    seconds to `_step_ended`, which a subclass defines. A subclass that
    overrides ``on_train_begin`` calls this one, which restarts the numbering.

    Example:
        >>> class PrintSteps(_TimedSteps):  # doctest: +SKIP
        ...     def _step_ended(self, batch, first, last, step_time):
        ...         print(f"steps {first}..{last}: {step_time:.2f} s")
    """

    def __init__(self) -> None:
        super().__init__()
        self._steps = _StepCounter()
        self._batch_start = 0.0

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._steps.reset()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._steps.begin(batch)
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        step_time = time.perf_counter() - self._batch_start
        first, last = self._steps.end(batch)
        self._step_ended(batch, first, last, step_time)

    def _step_ended(self, batch: int, first: int, last: int, step_time: float) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _step_ended")


class _EveryNthStepWriter(_TimedSteps):
    """Writes the statistics of `device` after every `every_n_batches`-th step.

    The writer is opened when training begins (`_open`, which a subclass
    defines, returns an object with ``close()``) and closed when it ends; a
    logged execution (one holding a step that is a multiple of
    `every_n_batches`) goes to `_write` with the statistics read after it.
    Raises ValueError for a `device` with no LMS statistics or
    `every_n_batches` below 1.

    Example:
        >>> class PrintRows(_EveryNthStepWriter):  # doctest: +SKIP
        ...     def _open(self): return sys.stdout
        ...     def _write(self, batch, step, step_time, values): print(step, values)
    """

    def __init__(self, device: int | str | Any, every_n_batches: int) -> None:
        super().__init__()
        self.every_n_batches = _check_every("every_n_batches", every_n_batches)
        self.device = _check_device(device)
        self._writer: Any = None

    def _open(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define _open")

    def _write(self, batch: int, step: int, step_time: float, values: dict[str, int]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _write")

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._writer = self._open()
        super().on_train_begin(logs)

    def _step_ended(self, batch: int, first: int, last: int, step_time: float) -> None:
        if self._writer is not None and _holds_multiple(first, last, self.every_n_batches):
            self._write(batch, last, step_time, lms.get_statistics(self.device))

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class LMSStatsLogger(_EveryNthStepWriter):
    """Logs LMS statistics to a CSV file, one row per logged training batch.

    Columns: ``epoch``, ``batch`` (within the epoch), ``step`` (batches trained
    before this one, across epochs), ``step_time_s`` (the batch's wall time in
    seconds), then every statistic of `device` read when the batch ended, or
    only those named in `statistics`. Each row is flushed as it is written,
    so a run that crashes keeps its rows.

    With ``model.compile(..., steps_per_execution=N)``, N > 1, it writes one
    row per execution of N steps, since statistics cannot be read between
    the steps of one execution: ``batch`` and ``step`` are the execution's
    last step (steps 3, 7, ... for N=4) and ``step_time_s`` is the whole
    execution's time. `every_n_batches` still counts steps: an execution is
    logged when one of its steps is a multiple of it.

    Args:
        path: the CSV file, created or overwritten when training begins.
        device: the LMS device, ``0`` or a name like ``"GPU:0"`` (see
            ``tensorflow_lms_allocator.get_statistics``).
        statistics: the statistics to log (engine names like
            ``"bytes_reclaimed"`` or getter names like ``"get_bytes_reclaimed"``);
            None logs all of them.
        every_n_batches: log batches whose step is a multiple of this
            (executions holding such a step, with steps_per_execution > 1).

    Example:
        >>> import tensorflow_lms_allocator  # before tensorflow
        >>> import tensorflow as tf
        >>> from tensorflow_lms_allocator.callbacks import LMSStatsLogger
        >>> logger = LMSStatsLogger(  # doctest: +SKIP
        ...     "run.csv", device="GPU:0", statistics=["bytes_in_use", "bytes_reclaimed"])
        >>> model.fit(x, y, epochs=2, callbacks=[logger])  # doctest: +SKIP

    Raises ValueError for a `device` with no LMS statistics, an unknown
    statistic, or `every_n_batches` below 1.
    """

    def __init__(self, path: str | os.PathLike[str], device: int | str | Any = 0,
                 statistics: Iterable[str] | None = None,
                 every_n_batches: int = 1) -> None:
        path = os.fspath(path)
        super().__init__(device, every_n_batches)
        self.path = path
        self.statistics = _select_statistics(statistics)
        self._epoch = 0

    def _open(self) -> StatsCsvWriter:
        return StatsCsvWriter(self.path, self.statistics)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def _write(self, batch: int, step: int, step_time: float, values: dict[str, int]) -> None:
        self._writer.write_row(self._epoch, batch, step, step_time, values)


class LMSStatsAverage(_TimedSteps):
    """Averages the swap statistics per batch over a range of steps, as JSON.

    Over the steps `start_batch` to `end_batch` (inclusive, counted from 0
    across epochs like the CSV's ``step`` column), records how much each swap
    counter grew (bytes reclaimed, single and full reclaims, evictions,
    page-ins, bytes paged in, bytes copied out and in) and the step time, and writes one JSON document
    to `path` when step `end_batch` ends, or when training ends if it never
    got there (then ``"completed": false`` and the numbers cover the steps
    that ran). IBM TFLMS's examples averaged the same way to compare batch
    sizes and settings; start after the first steps to leave out tracing and
    warm-up.

    A step's growth is measured from the end of the step before it (from the
    start of the step for the first step of training), so the totals equal
    the difference of the CSV rows of `LMSStatsLogger` around the range.

    The document::

        {"device": "GPU:0", "start_batch": 5, "end_batch": 14, "completed": true,
         "batches": 10, "first_step": 5, "last_step": 14,
         "totals":   {"bytes_reclaimed": ..., "num_page_ins": ..., "step_time_s": ...},
         "averages": {"bytes_reclaimed": ..., "num_page_ins": ..., "step_time_s": ...}}

    with ``averages`` = ``totals`` / ``batches`` and ``num_reclaims`` the sum
    of single and full reclaims. ``first_step`` and ``last_step`` are the
    steps the numbers cover (null when none ran).

    With ``model.compile(..., steps_per_execution=N)``, N > 1, statistics
    cannot be read between the steps of one execution, so the range covers
    whole executions: every execution holding a step of start_batch..end_batch
    counts with all its steps (``first_step`` and ``last_step`` say which),
    ``batches`` counts steps, and the document is written when the execution
    holding `end_batch` ends.

    Example:
        >>> from tensorflow_lms_allocator.callbacks import LMSStatsAverage
        >>> average = LMSStatsAverage(  # doctest: +SKIP
        ...     "avg.json", start_batch=5, end_batch=14)
        >>> model.fit(x, y, epochs=2, callbacks=[average])  # doctest: +SKIP

    Raises ValueError for a negative `start_batch`, an `end_batch` below it,
    or a `device` with no LMS statistics.
    """

    def __init__(self, path: str | os.PathLike[str], start_batch: int, end_batch: int,
                 device: int | str | Any = 0) -> None:
        super().__init__()
        for argument, value in (("start_batch", start_batch), ("end_batch", end_batch)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"{argument} must be a step number >= 0, not {value!r}")
        if end_batch < start_batch:
            raise ValueError(f"end_batch={end_batch!r} is before start_batch={start_batch!r}; "
                             "the range is start_batch..end_batch, inclusive")
        self.path = os.fspath(path)
        self.start_batch = int(start_batch)
        self.end_batch = int(end_batch)
        self.device = _check_device(device)
        self._reset()

    def _reset(self) -> None:
        self._first_step: int | None = None
        self._last_step: int | None = None
        self._previous: dict[str, int] | None = None
        self._totals = {name: 0 for name in SWAP_COUNTERS}
        self._step_time = 0.0
        self._batches = 0
        self._written = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._reset()
        super().on_train_begin(logs)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._previous is None:
            self._previous = lms.get_statistics(self.device)
        super().on_train_batch_begin(batch, logs)

    def _step_ended(self, batch: int, first: int, last: int, step_time: float) -> None:
        now = lms.get_statistics(self.device)
        if first <= self.end_batch and last >= self.start_batch and not self._written:
            assert self._previous is not None
            for name in SWAP_COUNTERS:
                self._totals[name] += now[name] - self._previous[name]
            self._step_time += step_time
            self._batches += last - first + 1
            if self._first_step is None:
                self._first_step = first
            self._last_step = last
            if last >= self.end_batch:
                self._write(completed=True)
        self._previous = now

    def on_train_end(self, logs: dict | None = None) -> None:
        if not self._written:
            self._write(completed=False)

    def _write(self, completed: bool) -> None:
        totals: dict[str, float] = dict(self._totals)
        totals["num_reclaims"] = totals["num_single_reclaims"] + totals["num_full_reclaims"]
        totals["step_time_s"] = self._step_time
        averages = {name: (value / self._batches if self._batches else math.nan)
                    for name, value in totals.items()}
        document = {
            "device": self.device,
            "start_batch": self.start_batch,
            "end_batch": self.end_batch,
            "completed": completed,
            "batches": self._batches,
            "first_step": self._first_step,
            "last_step": self._last_step,
            "totals": totals,
            "averages": averages,
        }
        if not completed:
            document["note"] = (f"training ended after {self._steps.trained} steps, before step "
                                f"{self.end_batch}; the numbers cover the "
                                f"{self._batches} steps of the range that ran")
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(self.path, "w") as file:
            # NaN (no step of the range ran) is written as null, valid JSON.
            json.dump(_nan_to_none(document), file, indent=2)
            file.write("\n")
        self._written = True


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _nan_to_none(item) for key, item in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


class LMSStatsTensorBoard(_EveryNthStepWriter):
    """Writes every LMS statistic as a TensorBoard scalar ``lms/<statistic>``.

    The step of each scalar is the global step (batches trained before it in
    this run, across epochs), so the curves line up with the CSV's ``step``
    column; with steps_per_execution > 1, one point per execution at its last
    step, as the CSV. Open with ``tensorboard --logdir LOG_DIR``; the event files sit
    beside those of Keras' own TensorBoard callback when both use one
    `log_dir`. Also writes ``lms/step_time_s``. Writing needs only
    TensorFlow; viewing needs ``pip install tensorboard``.

    Args:
        log_dir: the directory of the event file (created if missing).
        device: the LMS device, ``0`` or a name like ``"GPU:0"``.
        every_n_batches: write batches whose step is a multiple of this.

    Example:
        >>> from tensorflow_lms_allocator.callbacks import LMSStatsTensorBoard
        >>> model.fit(x, y, callbacks=[LMSStatsTensorBoard("logs/run1")])  # doctest: +SKIP

    Raises ValueError for a `device` with no LMS statistics or
    `every_n_batches` below 1.
    """

    def __init__(self, log_dir: str | os.PathLike[str], device: int | str | Any = 0,
                 every_n_batches: int = 1) -> None:
        log_dir = os.fspath(log_dir)
        super().__init__(device, every_n_batches)
        self.log_dir = log_dir

    def _open(self) -> Any:
        return tf.summary.create_file_writer(os.path.join(self.log_dir, "lms"))

    def _write(self, batch: int, step: int, step_time: float, values: dict[str, int]) -> None:
        with self._writer.as_default(step=step):
            _write_scalar("lms/step_time_s", step_time)
            for name, value in values.items():
                _write_scalar(f"lms/{name}", value)
        self._writer.flush()


def _write_scalar(tag: str, value: float) -> None:
    """What ``tf.summary.scalar`` writes, without needing the tensorboard package.

    TensorFlow's ``tf.summary.scalar`` is implemented by tensorboard; the
    record it writes is a float32 tensor tagged for the "scalars" plugin,
    which ``tf.summary.write`` writes as well. TensorBoard shows these exactly
    as its own scalars (float32: byte counts keep 24 significant bits).
    """
    metadata = tf.compat.v1.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    tf.summary.write(tag, tf.constant(value, tf.float32), metadata=metadata)


class LMSStatsSessionHook(tf.compat.v1.train.SessionRunHook):
    """The CSV of `LMSStatsLogger`, for ``tf.compat.v1`` sessions.

    Add it to the hooks of a ``tf.compat.v1.train.MonitoredTrainingSession``
    (or any ``MonitoredSession``): every `every_n_steps`-th ``run`` call
    writes a row with ``epoch`` 0, ``batch`` and ``step`` the run call's
    number (0-based), ``step_time_s`` the call's wall time, and every
    statistic of `device` after the call. The file is created when the
    session is being created (the hook's ``begin``) and closed when the
    session ends; rows are flushed as they are written.

    Example:
        >>> from tensorflow_lms_allocator.callbacks import LMSStatsSessionHook
        >>> hook = LMSStatsSessionHook("run.csv")  # doctest: +SKIP
        >>> with tf.compat.v1.train.MonitoredTrainingSession(  # doctest: +SKIP
        ...         hooks=[hook]) as session:
        ...     while not session.should_stop():
        ...         session.run(train_op)

    Raises ValueError for a `device` with no LMS statistics or
    `every_n_steps` below 1.
    """

    def __init__(self, path: str | os.PathLike[str], device: int | str | Any = 0,
                 every_n_steps: int = 1) -> None:
        self.path = os.fspath(path)
        self.every_n_steps = _check_every("every_n_steps", every_n_steps)
        self.device = _check_device(device)
        self.statistics = statistic_names()
        self._writer: StatsCsvWriter | None = None
        self._step = 0
        self._run_start = 0.0

    def begin(self) -> None:
        self._writer = StatsCsvWriter(self.path, self.statistics)
        self._step = 0

    def before_run(self, run_context: Any) -> None:
        self._run_start = time.perf_counter()
        return None

    def after_run(self, run_context: Any, run_values: Any) -> None:
        step_time = time.perf_counter() - self._run_start
        if self._writer is not None and self._step % self.every_n_steps == 0:
            self._writer.write_row(0, self._step, self._step, step_time,
                                   lms.get_statistics(self.device))
        self._step += 1

    def end(self, session: Any) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


__all__ = [
    "CSV_LEADING_COLUMNS",
    "LMSStatsAverage",
    "LMSStatsLogger",
    "LMSStatsSessionHook",
    "LMSStatsTensorBoard",
    "StatsCsvWriter",
    "SWAP_COUNTERS",
    "statistic_names",
]
