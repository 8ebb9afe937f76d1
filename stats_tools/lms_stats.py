#!/usr/bin/env python3
"""Plots and summarises the CSV files of LMS statistics.

The files are those ``tensorflow_lms_allocator.callbacks.LMSStatsLogger`` and
``LMSStatsSessionHook`` write: a header ``epoch,batch,step,step_time_s,<statistic>...``
and one row per logged training step, byte counts in bytes, cumulative
counters (``bytes_reclaimed``, ``num_page_ins``, ...) counted since the process
started.

    python stats_tools/lms_stats.py plot run.csv [run2.csv ...] -o run.png
    python stats_tools/lms_stats.py summary run.csv [--json]
    python stats_tools/lms_stats.py timeline steps.lmstrace -o steps.html  # or .png

Needs only Python, NumPy and (for ``plot``) matplotlib; not TensorFlow.
A missing or malformed file is an error on stderr and exit code 2.

Example:
    $ python stats_tools/lms_stats.py summary run.csv
    run.csv: 12 rows, steps 0-11
    ...
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

LEADING = ("epoch", "batch", "step", "step_time_s")
REQUIRED = ("step", "step_time_s")
MIB = float(1 << 20)

# Cumulative counters summarised as totals and per-step figures.
SWAP = ("bytes_reclaimed", "bytes_paged_in", "num_evictions", "num_page_ins",
        "num_single_reclaims", "num_full_reclaims", "num_defragmentations")
# Peaks (and the limit) summarised as the last row's value.
PEAKS = ("bytes_limit", "peak_bytes_in_use", "peak_bytes_active", "peak_bytes_reserved",
         "peak_bytes_reclaimed", "host_peak_bytes_in_use", "largest_alloc_size")


class InputError(Exception):
    """A file that is missing or is not an LMS statistics CSV; the message says which."""


@dataclass
class Run:
    """One CSV file: its name and its columns as lists of numbers (one per row)."""

    path: str
    columns: dict[str, list[float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return os.path.basename(self.path)

    @property
    def rows(self) -> int:
        return len(self.columns["step"])

    def has(self, name: str) -> bool:
        return name in self.columns


def read_run(path: str) -> Run:
    """Reads an LMS statistics CSV, checking its shape; InputError says what is wrong.

    Example:
        >>> run = read_run("run.csv")  # doctest: +SKIP
        >>> run.columns["bytes_reclaimed"][-1]  # doctest: +SKIP
        322961408.0
    """
    hint = ("expected a CSV written by tensorflow_lms_allocator.callbacks.LMSStatsLogger "
            "or LMSStatsSessionHook (header epoch,batch,step,step_time_s,<statistics>)")
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not a CSV file")
    try:
        with open(path, newline="") as file:
            lines = list(csv.reader(file))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"{path}: cannot be read as CSV ({error}); {hint}") from error
    if not lines:
        raise InputError(f"{path}: the file is empty; {hint}")
    header = [name.strip() for name in lines[0]]
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        raise InputError(f"{path}: the header has no {', '.join(missing)} column; {hint}")
    if len(set(header)) != len(header):
        raise InputError(f"{path}: the header repeats a column; {hint}")
    run = Run(path, {name: [] for name in header})
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        if len(line) != len(header):
            raise InputError(f"{path}:{number}: {len(line)} fields, the header has "
                             f"{len(header)}; {hint}")
        for name, text in zip(header, line):
            try:
                value = float(text)
            except ValueError:
                raise InputError(f"{path}:{number}: column {name} is {text!r}, not a "
                                 f"number; {hint}") from None
            if not math.isfinite(value):
                raise InputError(f"{path}:{number}: column {name} is {text!r}; {hint}")
            run.columns[name].append(value)
    if run.rows == 0:
        raise InputError(f"{path}: a header but no rows (did training log a step?); {hint}")
    steps = run.columns["step"]
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise InputError(f"{path}: the step column does not increase from row to row; "
                         f"{hint}")
    return run


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (NumPy's default method).

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
        2.5
    """
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(run: Run) -> dict[str, Any]:
    """The summary of one run, as a JSON-ready dict.

    - ``peaks``: the last row's peaks and the device limit, in bytes;
    - ``totals``: the last row's cumulative counters (since the process started);
    - ``per_step``: how much each counter grew per step between the first and the
      last logged row (leaving out the first step, which also traces the
      model), with ``bytes_swapped`` = reclaimed + paged in;
    - ``step_time_s``: the first logged step's time, and p50, p90, max and mean
      over the other rows (over all rows if there is one).

    Example:
        >>> summarise(read_run("run.csv"))["per_step"]["bytes_reclaimed"]  # doctest: +SKIP
        25165824.0
    """
    columns = run.columns
    steps = columns["step"]
    last = {name: values[-1] for name, values in columns.items()}
    first = {name: values[0] for name, values in columns.items()}
    span = steps[-1] - steps[0]
    per_step: dict[str, float | None] = {}
    for name in SWAP:
        if run.has(name):
            per_step[name] = (last[name] - first[name]) / span if span else None
    if "bytes_reclaimed" in per_step and "bytes_paged_in" in per_step:
        a, b = per_step["bytes_reclaimed"], per_step["bytes_paged_in"]
        per_step["bytes_swapped"] = None if a is None or b is None else a + b
    totals = {name: int(last[name]) for name in SWAP if run.has(name)}
    if "bytes_reclaimed" in totals and "bytes_paged_in" in totals:
        totals["bytes_swapped"] = totals["bytes_reclaimed"] + totals["bytes_paged_in"]
    times = columns["step_time_s"]
    later = times[1:] if len(times) > 1 else times
    return {
        "file": run.path,
        "rows": run.rows,
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        # The growth from the end of the first logged step to the end of the
        # last covers the steps after the first.
        "per_step_over": [int(steps[0]) + 1, int(steps[-1])] if span else None,
        "peaks": {name: int(last[name]) for name in PEAKS if run.has(name)},
        "totals": totals,
        "per_step": per_step,
        "step_time_s": {
            "first": times[0],
            "p50": percentile(later, 50),
            "p90": percentile(later, 90),
            "max": max(later),
            "mean": sum(later) / len(later),
        },
    }


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:,.1f} MiB"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}" if value != int(value) else f"{int(value):,}"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as an aligned, readable table.

    Example:
        >>> print(format_summary(summarise(read_run("run.csv"))))  # doctest: +SKIP
    """
    lines = [f"{summary['file']}: {summary['rows']} rows, steps "
             f"{summary['first_step']}-{summary['last_step']}"]
    peaks, totals, per_step = summary["peaks"], summary["totals"], summary["per_step"]
    table: list[tuple[str, str, str]] = []
    names = {
        "bytes_limit": "device limit",
        "peak_bytes_in_use": "peak in use (live tensors)",
        "peak_bytes_active": "peak active (pinned by kernels)",
        "peak_bytes_reserved": "peak device memory reserved",
        "peak_bytes_reclaimed": "peak held in host memory",
        "host_peak_bytes_in_use": "peak host pool in use",
        "largest_alloc_size": "largest allocation",
    }
    for name, text in names.items():
        if name in peaks:
            note = ""
            if name == "peak_bytes_in_use" and peaks.get("bytes_limit"):
                note = f"{peaks[name] / peaks['bytes_limit']:.2f}x the device limit"
            table.append((text, _mib(peaks[name]), note))
    over = summary["per_step_over"]
    span = f"steps {over[0]}-{over[1]}" if over else "one row"
    swap = {
        "bytes_reclaimed": ("bytes reclaimed (evicted)", _mib),
        "bytes_paged_in": ("bytes paged in", _mib),
        "bytes_swapped": ("bytes swapped (both ways)", _mib),
        "num_evictions": ("evictions", _count),
        "num_page_ins": ("page-ins", _count),
        "num_single_reclaims": ("single reclaims", _count),
        "num_full_reclaims": ("full reclaims", _count),
        "num_defragmentations": ("defragmentations", _count),
    }
    rows: list[tuple[str, str, str]] = []
    for name, (text, fmt) in swap.items():
        if name in per_step or name in totals:
            rows.append((text, fmt(totals.get(name)), fmt(per_step.get(name))))
    width = max([len(r[0]) for r in table + rows] + [20])
    lines.append("")
    lines.append("memory")
    for text, value, note in table:
        lines.append(f"  {text:<{width}}  {value:>14}  {note}".rstrip())
    if rows:
        lines.append("")
        lines.append(f"  {'swapping':<{width}}  {'total':>14}  {'per step':>14}")
        lines.append(f"  {'':<{width}}  {'':>14}  {'(' + span + ')':>14}")
        for text, total, each in rows:
            lines.append(f"  {text:<{width}}  {total:>14}  {each:>14}")
    times = summary["step_time_s"]
    lines.append("")
    if summary["rows"] == 1:
        lines.append(f"step time (s)  {times['first']:.3f} (one step logged)")
    else:
        lines.append("step time (s)  first {first:.3f}   after it: p50 {p50:.3f}  "
                     "p90 {p90:.3f}  max {max:.3f}  mean {mean:.3f}".format(**times))
    return "\n".join(lines)


# The plot: one panel per quantity, every run overlaid in one colour (and
# marker) per run. Levels are read when a step has ended, after its kernels
# released their tensors, so the memory panels also draw the peak so far
# (dotted) that the step reached inside.
PANELS: tuple[tuple[str, str, str], ...] = (
    ("bytes_in_use", "Device memory in use (live tensors)", "MiB"),
    ("bytes_active", "Active: pinned by running kernels", "MiB"),
    ("bytes_inactive", "Inactive: waiting for a later use", "MiB"),
    ("bytes_reclaimed", "Reclaimed: evicted to host, cumulative", "MiB"),
    ("host_bytes_in_use", "Host memory holding evicted tensors", "MiB"),
    ("step_time_s", "Step time", "seconds"),
)

PEAK_OF = {"bytes_in_use": "peak_bytes_in_use", "bytes_active": "peak_bytes_active",
           "host_bytes_in_use": "host_peak_bytes_in_use"}
MARKERS = ("o", "s", "^", "D", "v", "P")


def plot(runs: Sequence[Run], output: str) -> None:
    """Draws every run's statistics against the training step into one PNG.

    Example:
        >>> plot([read_run("a.csv"), read_run("b.csv")], "runs.png")  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    # The legend names runs by file name, or by the paths given when two
    # files share a name (a/run.csv, b/run.csv).
    names = [run.label for run in runs]
    labels = names if len(set(names)) == len(names) else [run.path for run in runs]
    figure, axes = plt.subplots(2, 3, figsize=(16, 9), sharex=True, layout="constrained")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, run in enumerate(runs):
        colour = colours[index % len(colours)]
        steps = run.columns["step"]
        for axis, (name, _, unit) in zip(axes.flat, PANELS):
            if not run.has(name):
                continue
            scale = MIB if unit == "MiB" else 1.0
            values = [v / scale for v in run.columns[name]]
            axis.plot(steps, values, color=colour, linewidth=1.6, label=labels[index],
                      marker=MARKERS[index % len(MARKERS)] if run.rows <= 60 else None,
                      markersize=5, fillstyle="none")
            peak = PEAK_OF.get(name)
            if peak and run.has(peak):
                axis.plot(steps, [v / MIB for v in run.columns[peak]], color=colour,
                          linestyle=":", linewidth=1.6)
            if name == "bytes_in_use" and run.has("bytes_limit"):
                axis.axhline(run.columns["bytes_limit"][-1] / MIB, color=colour,
                             linestyle="--", linewidth=1)
    for axis, (name, title, unit) in zip(axes.flat, PANELS):
        axis.set_title(title, fontsize=12)
        axis.set_ylabel(unit)
        axis.grid(True, alpha=0.3)
        # From zero, with room above a flat line so it does not hide in the frame.
        axis.set_ylim(0, max(axis.get_ylim()[1], 1e-3) * 1.08)
        if not any(run.has(name) for run in runs):
            axis.text(0.5, 0.5, f"{name} not logged", transform=axis.transAxes,
                      ha="center", va="center", color="grey")
    for axis in axes[-1]:
        axis.set_xlabel("training step (batch, counted across epochs)")
        axis.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for axis, (name, _, _) in zip(axes.flat, PANELS):
        notes = []
        if name in PEAK_OF:
            notes.append("solid: at the end of the step   dotted: peak so far")
        if name == "bytes_in_use" and any(run.has("bytes_limit") for run in runs):
            notes.append("dashed: device limit")
        if notes:
            axis.text(0.01, 0.02, "\n".join(notes), transform=axis.transAxes, ha="left",
                      va="bottom", fontsize=8.5, color="dimgrey")
    handles = [plt.Line2D([], [], color=colours[i % len(colours)], linewidth=2.5,
                          marker=MARKERS[i % len(MARKERS)], fillstyle="none")
               for i in range(len(runs))]
    figure.suptitle("LMS statistics per training step", fontsize=14, fontweight="bold")
    figure.legend(handles, labels, loc="outside lower center",
                  ncols=min(len(runs), 4), fontsize=11, frameon=False)
    directory = os.path.dirname(output)
    try:
        if directory:
            os.makedirs(directory, exist_ok=True)
        figure.savefig(output, dpi=100)
    except OSError as error:
        raise InputError(f"{output}: cannot write the PNG ({error.strerror or error})") from error
    finally:
        plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lms_stats.py",
        description="Plot and summarise LMS statistics CSV files (written by "
                    "tensorflow_lms_allocator.callbacks.LMSStatsLogger or LMSStatsSessionHook).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plot_parser = commands.add_parser(
        "plot", help="draw device memory, swapping and step time against the step, into a PNG",
        description="One figure: device bytes in use (with the device limit), active, "
                    "inactive, reclaimed (cumulative), host bytes in use, and step time, "
                    "against the training step; several runs are overlaid, one colour each, "
                    "with the file names as legend.")
    plot_parser.add_argument("csv", nargs="+", metavar="RUN.csv", help="statistics CSV files")
    plot_parser.add_argument("-o", "--output", required=True, metavar="OUT.png",
                             help="the PNG to write")
    summary_parser = commands.add_parser(
        "summary", help="print peaks, swap totals and per-step figures, and step times",
        description="Peaks and the device limit, swap totals and growth per step, and step "
                    "time percentiles of one run, as a table or JSON.")
    summary_parser.add_argument("csv", metavar="RUN.csv", help="a statistics CSV file")
    summary_parser.add_argument("--json", action="store_true",
                                help="print the summary as one JSON document")
    timeline_parser = commands.add_parser(
        "timeline", help="draw an access trace's allocations over time (HTML or PNG)",
        description="Every allocation of an access trace (tensorflow_lms_allocator."
                    "record_trace) as a band over time, stacked by address or size, "
                    "coloured pinned / resident / evicted, with reclaims and page-ins "
                    "marked. OUT.html is self-contained (no network).")
    timeline_parser.add_argument("trace", metavar="TRACE", help="an LMS access trace")
    timeline_parser.add_argument("-o", "--output", required=True, metavar="OUT.html|OUT.png")
    timeline_parser.add_argument("--stack", choices=("address", "size"), default="address")
    args = parser.parse_args(argv)
    try:
        if args.command == "timeline":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import lms_timeline

            try:  # a trace's TraceFormatError is a ValueError
                print(lms_timeline.render(args.trace, args.output, args.stack))
            except (OSError, ValueError) as error:
                raise InputError(str(error)) from error
        elif args.command == "plot":
            runs = [read_run(path) for path in args.csv]
            plot(runs, args.output)
            print(f"wrote {args.output} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
        else:
            summary = summarise(read_run(args.csv))
            print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    except InputError as error:
        print(f"lms_stats.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
