"""stats_tools/lms_stats.py over the CSV files of a real training run
(tests/tf_programs/callbacks.py: a Keras model and a tf.compat.v1 graph over a
48 MiB emulated device), run as a user runs it: a subprocess per command.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tf_helpers import describe, run_program

pytestmark = pytest.mark.quick

TOOL = Path(__file__).resolve().parent.parent / "stats_tools" / "lms_stats.py"
# matplotlib's first two default colours: run 1 and run 2 of a plot.
BLUE, ORANGE = (0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory with fit.csv (12 Keras steps), session.csv (6 session runs)
    and fit_every2.csv (two statistics, every other step)."""
    out = tmp_path_factory.mktemp("stats_runs")
    run = run_program("callbacks.py", str(out),
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "48", "TF_LMS_ENABLED": "1"})
    assert run.returncode == 0 and run.result, describe(run)
    return out


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=120)


def read_rows(path: Path) -> list[dict[str, float]]:
    with open(path, newline="") as file:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(file)]


def colour_pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    import matplotlib.image

    pixels = (matplotlib.image.imread(str(png))[:, :, :3] * 255).round()
    return int((np.abs(pixels - np.array(rgb)).max(axis=2) <= 8).sum())


def test_help_names_both_commands():
    done = tool("--help")
    assert done.returncode == 0
    assert "plot" in done.stdout and "summary" in done.stdout
    plot_help = tool("plot", "--help")
    assert plot_help.returncode == 0 and "OUT.png" in plot_help.stdout


def test_plot_overlays_several_runs_in_one_readable_png(runs, tmp_path):
    png = tmp_path / "two.png"
    done = tool("plot", str(runs / "fit.csv"), str(runs / "session.csv"), "-o", str(png))
    assert done.returncode == 0, done.stderr
    assert png.stat().st_size > 40_000
    import matplotlib.image

    image = matplotlib.image.imread(str(png))
    assert image.shape[:2] == (900, 1600)
    assert image[:, :, :3].std() > 0.05  # drawn on, not a blank canvas
    # Both runs are drawn, each in its own colour.
    assert colour_pixels(png, BLUE) > 2000 and colour_pixels(png, ORANGE) > 2000

    single = tmp_path / "one.png"
    assert tool("plot", str(runs / "fit.csv"), "-o", str(single)).returncode == 0
    assert colour_pixels(single, BLUE) > 2000 and colour_pixels(single, ORANGE) == 0


def test_plot_draws_a_csv_narrowed_to_a_few_statistics(runs, tmp_path):
    png = tmp_path / "narrow.png"
    done = tool("plot", str(runs / "fit_every2.csv"), "-o", str(png))
    assert done.returncode == 0, done.stderr
    assert png.stat().st_size > 20_000 and colour_pixels(png, BLUE) > 500


def test_summary_json_numbers_are_the_csv_rows(runs):
    done = tool("summary", str(runs / "fit.csv"), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    rows = read_rows(runs / "fit.csv")
    first, last = rows[0], rows[-1]
    assert (summary["rows"], summary["first_step"], summary["last_step"]) == (12, 0, 11)
    assert summary["peaks"]["bytes_limit"] == 48 << 20
    for name in ("peak_bytes_in_use", "peak_bytes_active", "host_peak_bytes_in_use"):
        assert summary["peaks"][name] == last[name]
    for name in ("bytes_reclaimed", "bytes_paged_in", "num_page_ins", "num_evictions"):
        assert summary["totals"][name] == last[name]
        assert summary["per_step"][name] == pytest.approx((last[name] - first[name]) / 11)
    assert summary["totals"]["bytes_reclaimed"] > 0
    assert summary["per_step"]["bytes_swapped"] == pytest.approx(
        summary["per_step"]["bytes_reclaimed"] + summary["per_step"]["bytes_paged_in"])
    times = [r["step_time_s"] for r in rows]
    assert summary["step_time_s"]["first"] == times[0]
    for key, q in (("p50", 50), ("p90", 90)):
        assert summary["step_time_s"][key] == pytest.approx(np.percentile(times[1:], q))
    assert summary["step_time_s"]["max"] == max(times[1:])


def test_summary_table_shows_the_same_numbers_in_mib(runs):
    done = tool("summary", str(runs / "fit.csv"))
    assert done.returncode == 0, done.stderr
    summary = json.loads(tool("summary", str(runs / "fit.csv"), "--json").stdout)
    text = done.stdout
    lines = {line.strip().split("  ")[0]: line for line in text.splitlines()}
    assert "48.0 MiB" in lines["device limit"]
    assert f"{summary['peaks']['peak_bytes_in_use'] / 2**20:,.1f} MiB" in lines[
        "peak in use (live tensors)"]
    reclaimed = lines["bytes reclaimed (evicted)"]
    assert f"{summary['totals']['bytes_reclaimed'] / 2**20:,.1f} MiB" in reclaimed
    assert f"{summary['per_step']['bytes_reclaimed'] / 2**20:,.1f} MiB" in reclaimed
    assert f"p50 {summary['step_time_s']['p50']:.3f}" in text


def test_a_missing_file_is_exit_code_2_naming_it(runs, tmp_path):
    missing = tmp_path / "nope.csv"
    for args in (("summary", str(missing)),
                 ("plot", str(runs / "fit.csv"), str(missing), "-o", str(tmp_path / "x.png"))):
        done = tool(*args)
        assert done.returncode == 2
        assert f"{missing}: no such file" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.png").exists()


def test_an_output_that_cannot_be_written_is_exit_code_2_naming_it(runs, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    output = blocker / "run.png"  # under a file, not a directory
    done = tool("plot", str(runs / "fit.csv"), "-o", str(output))
    assert done.returncode == 2
    assert f"{output}: cannot write the PNG" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("content, words", [
    ("", ["the file is empty"]),
    ("epoch,batch,bytes_in_use\n0,0,5\n", ["no step, step_time_s column"]),
    ("epoch,batch,step,step_time_s\n", ["no rows"]),
    ("epoch,batch,step,step_time_s,bytes_in_use\n0,0,0,0.1,12\n0,1,1,0.1,lots\n",
     [":3:", "bytes_in_use", "'lots'", "not a number"]),
    ("epoch,batch,step,step_time_s\n0,0,0\n", [":2:", "3 fields"]),
    ("epoch,batch,step,step_time_s\n0,1,1,0.1\n0,0,0,0.1\n", ["does not increase"]),
])
def test_a_malformed_csv_is_exit_code_2_saying_what_is_wrong(tmp_path, content, words):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    for args in (("summary", str(path)), ("plot", str(path), "-o", str(tmp_path / "x.png"))):
        done = tool(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"lms_stats.py: error: {path}")
        for word in words:
            assert word in done.stderr, done.stderr
        assert "LMSStatsLogger" in done.stderr  # what the file should have been


def test_usage_errors_are_exit_code_2():
    assert tool("plot", "x.csv").returncode == 2  # no -o
    assert tool("frobnicate").returncode == 2
