"""The LMS Keras callbacks and session hook (tensorflow_lms_allocator.callbacks),
on a real Keras model and a real tf.compat.v1 graph that exceed a 48 MiB
emulated device, so every step evicts and pages in.

One run of tests/tf_programs/callbacks.py (about 10 s) writes every file; the
tests read the files and compare them with what the public getters returned
at the same points of the same run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_lms_allocator.callbacks import CSV_LEADING_COLUMNS, SWAP_COUNTERS
from tensorflow_lms_allocator.engine import STATISTICS
from tf_helpers import describe, run_program

pytestmark = pytest.mark.tensorflow

CAP_MIB = 48
STEPS, EPOCHS = 6, 2  # the program's defaults: 12 Keras steps, 6 session runs
# Cumulative statistics: they never decrease.
COUNTERS = ("num_allocs", "peak_bytes_in_use", "largest_alloc_size", "peak_bytes_reserved",
            "peak_bytes_active", "bytes_reclaimed", "peak_bytes_reclaimed",
            "num_single_reclaims", "num_full_reclaims", "num_defragmentations",
            "bytes_defragged", "num_cached_placements", "host_peak_bytes_in_use", "num_page_ins", "bytes_paged_in",
            "num_evictions", "num_evictions_abandoned", "num_born_evicted", "num_failed_pins",
            "num_copies", "bytes_copied", "bytes_copied_out", "bytes_copied_in")
# What nothing after the last training step changes (no eviction or page-in).
SETTLED = (*SWAP_COUNTERS, "peak_bytes_in_use", "peak_bytes_reclaimed", "bytes_limit")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("callbacks")
    result = run_program("callbacks.py", str(out),
                         env={"TF_LMS_CPU_DEVICE_MEMORY_MB": str(CAP_MIB),
                              "TF_LMS_ENABLED": "1"})
    assert result.returncode == 0 and result.result, describe(result)
    return out, result.result


def read_csv(path: Path) -> tuple[list[str], list[dict[str, float]]]:
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        rows = [{k: float(v) if k == "step_time_s" else int(v) for k, v in row.items()}
                for row in reader]
        return list(reader.fieldnames or []), rows


def test_logger_writes_a_header_and_a_row_per_batch_with_epoch_batch_and_step(run):
    out, _ = run
    header, rows = read_csv(out / "fit.csv")
    assert header == [*CSV_LEADING_COLUMNS, *STATISTICS]
    assert [(r["epoch"], r["batch"], r["step"]) for r in rows] == [
        (epoch, batch, epoch * STEPS + batch) for epoch in range(EPOCHS) for batch in range(STEPS)]
    assert all(r["step_time_s"] > 0 for r in rows)


def test_logger_rows_equal_the_public_getters_read_at_the_end_of_each_batch(run):
    out, result = run
    _, rows = read_csv(out / "fit.csv")
    probe = result["fit"]["probe"]
    assert len(probe) == len(rows) == STEPS * EPOCHS
    for row, getters in zip(rows, probe):
        assert {name: row[name] for name in STATISTICS} == getters


def test_logger_rows_show_real_swapping_and_counters_that_never_decrease(run):
    out, result = run
    _, rows = read_csv(out / "fit.csv")
    for name in COUNTERS:
        values = [r[name] for r in rows]
        assert values == sorted(values), name
    last = rows[-1]
    assert last["bytes_limit"] == CAP_MIB << 20
    assert last["peak_bytes_in_use"] > last["bytes_limit"]  # the model needs more than the device
    # Every step swaps: reclaims and page-ins grow from each row to the next.
    assert all(b["bytes_reclaimed"] > a["bytes_reclaimed"] and b["num_page_ins"] > a["num_page_ins"]
               for a, b in zip(rows, rows[1:]))
    after = result["fit"]["after"]  # get_statistics(0) once fit returned
    assert {name: last[name] for name in SETTLED} == {name: after[name] for name in SETTLED}


def test_logger_narrowed_to_named_statistics_every_second_batch(run):
    out, _ = run
    header, rows = read_csv(out / "fit_every2.csv")
    # statistics=["get_bytes_reclaimed", "num_page_ins"]: getter names map to the engine's
    assert header == [*CSV_LEADING_COLUMNS, "bytes_reclaimed", "num_page_ins"]
    _, full = read_csv(out / "fit.csv")
    assert [r["step"] for r in rows] == list(range(0, STEPS * EPOCHS, 2))
    for row in rows:
        same_step = full[row["step"]]
        assert (row["bytes_reclaimed"], row["num_page_ins"]) == (
            same_step["bytes_reclaimed"], same_step["num_page_ins"])


def test_average_totals_and_means_equal_the_csv_rows_over_the_range(run):
    out, _ = run
    _, rows = read_csv(out / "fit.csv")
    document = json.loads((out / "average.json").read_text())
    start, end = 2, STEPS * EPOCHS - 2
    assert (document["start_batch"], document["end_batch"]) == (start, end)
    assert document["completed"] is True and document["batches"] == end - start + 1
    assert document["device"] == "CPU:0"
    for name in SWAP_COUNTERS:
        growth = [rows[s][name] - rows[s - 1][name] for s in range(start, end + 1)]
        assert document["totals"][name] == sum(growth), name
        assert document["averages"][name] == pytest.approx(np.mean(growth)), name
    reclaims = [rows[s]["num_single_reclaims"] + rows[s]["num_full_reclaims"]
                - rows[s - 1]["num_single_reclaims"] - rows[s - 1]["num_full_reclaims"]
                for s in range(start, end + 1)]
    assert document["averages"]["num_reclaims"] == pytest.approx(np.mean(reclaims))
    assert document["totals"]["bytes_reclaimed"] > 0
    # Each callback times the step itself; they differ by the callbacks run between.
    times = [rows[s]["step_time_s"] for s in range(start, end + 1)]
    assert document["averages"]["step_time_s"] == pytest.approx(np.mean(times), rel=0.05)


def test_average_of_a_range_training_never_finished_is_written_at_train_end(run):
    out, _ = run
    _, rows = read_csv(out / "fit.csv")
    document = json.loads((out / "average_unfinished.json").read_text())
    total = STEPS * EPOCHS
    assert document["completed"] is False
    assert (document["start_batch"], document["end_batch"]) == (1, total + 10)
    assert document["batches"] == total - 1  # steps 1..11 ran
    assert f"after {total} steps" in document["note"]
    assert document["totals"]["bytes_reclaimed"] == (rows[-1]["bytes_reclaimed"]
                                                     - rows[0]["bytes_reclaimed"])


def test_tensorboard_event_file_holds_every_statistic_as_an_lms_scalar_per_step(run):
    out, _ = run
    _, rows = read_csv(out / "fit.csv")
    files = list((out / "tensorboard").rglob("events.out.tfevents.*"))
    assert len(files) == 1
    scalars: dict[str, dict[int, float]] = {}
    for event in tf.compat.v1.train.summary_iterator(str(files[0])):
        for value in event.summary.value:
            assert value.metadata.plugin_data.plugin_name == "scalars"
            scalars.setdefault(value.tag, {})[event.step] = float(
                tf.make_ndarray(value.tensor))
    assert set(scalars) == {f"lms/{name}" for name in STATISTICS} | {"lms/step_time_s"}
    expected = {r["step"]: float(np.float32(r["bytes_reclaimed"])) for r in rows}
    assert scalars["lms/bytes_reclaimed"] == expected
    assert scalars["lms/bytes_limit"][0] == CAP_MIB << 20


def test_session_hook_writes_the_same_csv_for_a_monitored_training_session(run):
    out, result = run
    header, rows = read_csv(out / "session.csv")
    assert header == [*CSV_LEADING_COLUMNS, *STATISTICS]
    runs = result["session"]["runs"]
    assert runs == STEPS
    assert [(r["epoch"], r["batch"], r["step"]) for r in rows] == [(0, i, i) for i in range(runs)]
    _, fit_rows = read_csv(out / "fit.csv")
    # The graph also exceeds the device: each run call swaps more.
    previous = fit_rows[-1]["bytes_reclaimed"]
    for row in rows:
        assert row["bytes_reclaimed"] > previous
        previous = row["bytes_reclaimed"]
    after = result["session"]["after"]
    assert {name: rows[-1][name] for name in SETTLED} == {name: after[name] for name in SETTLED}


@pytest.mark.parametrize("case, words", [
    ("every_n_batches", ["every_n_batches", "-1", ">= 1"]),
    ("every_n_steps", ["every_n_steps", "not 0", ">= 1"]),
    ("statistics", ["'bogus'", "bytes_reclaimed", "num_page_ins", "valid names"]),
    ("end_batch", ["end_batch=3", "start_batch=5"]),
    ("start_batch", ["start_batch", "-1", ">= 0"]),
    ("device_index", ["device=3", "0 (CPU:0)", "TF_LMS_ENABLED=1"]),
    ("device_gpu", ["device='GPU:0'", "no LMS allocator"]),
])
def test_bad_arguments_raise_value_errors_naming_the_argument_and_value(run, case, words):
    _, result = run
    message = result["errors"][case]
    assert message.startswith("ValueError: "), message
    for word in words:
        assert word in message, message


def test_with_steps_per_execution_a_row_per_execution_whose_step_is_its_last_step(run):
    # steps_per_execution=4, two epochs of 4 steps: one execution per epoch.
    out, result = run
    assert result["per_execution"]["steps"] == 8
    header, rows = read_csv(out / "spe4.csv")
    assert header == [*CSV_LEADING_COLUMNS, *STATISTICS]
    assert [(r["epoch"], r["batch"], r["step"]) for r in rows] == [(0, 3, 3), (1, 3, 7)]
    # every_n_batches counts steps: only the first execution holds a multiple of 8 (step 0).
    _, every8 = read_csv(out / "spe4_every8.csv")
    assert [r["step"] for r in every8] == [3]


def test_with_steps_per_execution_averages_cover_whole_executions_per_step(run):
    out, _ = run
    _, rows = read_csv(out / "spe4.csv")
    document = json.loads((out / "spe4_average.json").read_text())
    # Steps 5..6 lie inside the second execution (steps 4..7): all four are counted.
    assert (document["start_batch"], document["end_batch"]) == (5, 6)
    assert document["completed"] is True and document["batches"] == 4
    assert (document["first_step"], document["last_step"]) == (4, 7)
    for name in SWAP_COUNTERS:
        assert document["totals"][name] == rows[1][name] - rows[0][name], name
        assert document["averages"][name] == pytest.approx(document["totals"][name] / 4), name


def test_with_steps_per_execution_tensorboard_scalars_are_at_each_executions_last_step(run):
    out, _ = run
    files = list((out / "spe4_tensorboard").rglob("events.out.tfevents.*"))
    assert len(files) == 1
    steps = {event.step for event in tf.compat.v1.train.summary_iterator(str(files[0]))
             if any(v.tag == "lms/bytes_reclaimed" for v in event.summary.value)}
    assert steps == {3, 7}
