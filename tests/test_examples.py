"""Smoke tests of the runnable examples in examples/.

Each example runs in its own process, with tiny sizes, on an emulated device
too small for its training step, so that LMS has to evict; the test reads what
the example printed. Together they take about a minute on two cores.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXIT_OUT_OF_MEMORY = 3

# Tiny sizes whose training step needs more memory than the emulated device has
# (peaks in use measured with LMS: the custom loop in float16 80 MiB, the
# session and tf.data examples 132-135 MiB in 64 MiB; MobileNetV2 48-63 MiB in
# 40 MiB), so LMS has to evict. The kernels running at once pinned at most
# 55 and 33 MiB (Eigen's convolutions take a 28 MiB temporary), which leaves a
# margin for the order kernels run in.
TINY_CONV = ("--batch-size", "16", "--image-size", "64", "--width", "16", "--layers", "24",
             "--device-memory-mb", "64")
TINY_MANY_MODELS = ("--model", "MobileNetV2", "--image-size", "32", "--batch-size", "8",
                    "--steps", "3", "--device-memory-mb", "40")


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (f"exit {self.returncode}\nstdout:\n{self.stdout[-3000:]}\n"
                f"stderr:\n{self.stderr[-3000:]}")

    def bytes_reclaimed(self) -> int:
        """The total the example's LMS statistics printed as 'bytes reclaimed (evicted)'."""
        match = re.search(r"bytes reclaimed \(evicted\)\s+([\d,]+) bytes", self.stdout)
        assert match, "no 'bytes reclaimed' line\n" + self.describe()
        return int(match.group(1).replace(",", ""))


def run_example(name: str, *args: str, timeout: float = 240,
                env: dict[str, str] | None = None, emulated: bool = True) -> Run:
    """Runs examples/<name> with `args` in a clean LMS environment (no GPU is used).

    `env` is added to the environment (which has no TF_CONFIG otherwise);
    `emulated=False` leaves out --force-emulated-device (demo.py has no such flag).
    """
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("TF_LMS_", "TF_GPU_HOST_MEM", "TF_CPU_", "TF_CONFIG"))}
    child_env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})})
    extra = ("--force-emulated-device",) if "--help" not in args and emulated else ()
    proc = subprocess.run(["nice", sys.executable, str(EXAMPLES / name), *args, *extra],
                          env=child_env, capture_output=True, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def step_lines(run: Run) -> list[str]:
    return [line for line in run.stdout.splitlines() if re.match(r"step \d+/\d+ ", line)]


@pytest.mark.parametrize("name", ["many_models.py", "custom_loop_mixed_precision.py",
                                  "session_graph.py", "tf_data_fit.py", "multi_worker.py"])
def test_help_of_each_example_exits_zero_and_names_the_lms_flags(name: str) -> None:
    run = run_example(name, "--help", timeout=60)
    assert run.returncode == 0, run.describe()
    for flag in ("--lms", "--no-lms", "--device-memory-mb", "--stats-csv"):
        assert flag in run.stdout, run.describe()


def test_many_models_fits_with_lms_on_a_device_too_small_and_writes_stats_csv(
        tmp_path: Path) -> None:
    stats = tmp_path / "run.csv"
    run = run_example("many_models.py", *TINY_MANY_MODELS, "--stats-csv", str(stats))
    assert run.returncode == 0, run.describe()
    assert "FITS: MobileNetV2" in run.stdout, run.describe()
    assert len(step_lines(run)) == 3 and "step 3/3" in run.stdout, run.describe()
    # Every step line estimates the time left; none is left after the last.
    assert all(re.search(r"  left ~ *\d+ s  ", line) for line in step_lines(run))
    assert re.search(r"  left ~ +0 s  ", step_lines(run)[-1]), run.describe()
    reclaimed = run.bytes_reclaimed()
    assert reclaimed > 0, run.describe()
    with stats.open() as f:
        rows = list(csv.DictReader(f))
    assert [row["step"] for row in rows] == ["1", "2", "3"]
    assert int(rows[-1]["bytes_reclaimed"]) == reclaimed


def test_many_models_without_lms_on_the_same_device_reports_out_of_memory_cleanly() -> None:
    run = run_example("many_models.py", *TINY_MANY_MODELS, "--no-lms")
    assert run.returncode == EXIT_OUT_OF_MEMORY, run.describe()
    assert "DOES NOT FIT: out of memory" in run.stdout, run.describe()
    assert "turn LMS on (--lms)" in run.stdout, run.describe()
    assert "Traceback" not in run.stdout + run.stderr, run.describe()


def test_many_models_names_valid_models_for_an_unknown_one() -> None:
    run = run_example("many_models.py", "--model", "ResNet5O", "--steps", "1")
    assert run.returncode == 2, run.describe()
    assert "keras.applications has no model 'ResNet5O'" in run.stderr, run.describe()
    assert "ResNet50" in run.stderr, run.describe()
    assert "Traceback" not in run.stderr, run.describe()


def test_custom_loop_mixed_precision_trains_with_lms_and_evicts() -> None:
    run = run_example("custom_loop_mixed_precision.py", *TINY_CONV, "--steps", "3",
                      "--policy", "mixed_float16")
    assert run.returncode == 0, run.describe()
    assert "TRAINED: policy mixed_float16" in run.stdout, run.describe()
    lines = step_lines(run)
    assert len(lines) == 3 and all("loss_scale" in line for line in lines), run.describe()
    assert run.bytes_reclaimed() > 0, run.describe()


def test_session_graph_trains_with_lms_and_prints_statistics_every_n_steps() -> None:
    run = run_example("session_graph.py", *TINY_CONV, "--steps", "4", "--stats-every", "2")
    assert run.returncode == 0, run.describe()
    assert "TRAINED:" in run.stdout and "4 steps" in run.stdout, run.describe()
    assert len(step_lines(run)) == 4, run.describe()
    # after step 2, and the summary at the end
    assert run.stdout.count("LMS statistics (device 0):") == 2, run.describe()
    assert run.bytes_reclaimed() > 0, run.describe()


def test_tf_data_fit_trains_with_lms_and_evicts() -> None:
    run = run_example("tf_data_fit.py", *TINY_CONV, "--examples", "32",
                      "--steps-per-epoch", "3")
    assert run.returncode == 0, run.describe()
    assert "TRAINED: tf.data from tensors" in run.stdout, run.describe()
    assert len(step_lines(run)) == 3, run.describe()
    assert run.bytes_reclaimed() > 0, run.describe()


SUPPORTED = ["many_models.py", "custom_loop_mixed_precision.py", "session_graph.py",
             "tf_data_fit.py", "multi_worker.py"]  # the examples using _example_support
MACHINE_MB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20


def assert_usage_error(run: Run, *words: str) -> None:
    """Exit 2 with argparse's usage error on stderr, naming every one of `words`."""
    assert run.returncode == 2, run.describe()
    assert "error: " in run.stderr and "Traceback" not in run.stderr, run.describe()
    for word in words:
        assert word in run.stderr, (word, run.describe())


@pytest.mark.parametrize("name", [*SUPPORTED, "resnet50_lms.py"])
@pytest.mark.parametrize("flags, words", [
    (("--host-memory-mb", "1"), ("--host-memory-mb 1", "use 2", "whole 2 MiB granules")),
    (("--host-memory-mb", "3"), ("--host-memory-mb 3", "use 2 or 4", "whole 2 MiB granules")),
    (("--device-memory-mb", "4000000000"),
     ("--device-memory-mb 4000000000", "more than this machine's memory")),
], ids=["host-1", "host-3", "device-huge"])
def test_memory_flags_must_be_whole_granules_within_this_machine(name, flags, words) -> None:
    # resnet50_lms.py has its own flags (no --force-emulated-device).
    run = run_example(name, *flags, timeout=120, emulated=name != "resnet50_lms.py")
    assert_usage_error(run, *words, f"{MACHINE_MB // 2 * 2}")


def test_demo_refuses_a_device_larger_than_this_machine() -> None:
    run = run_example("demo.py", "--device-memory-mb", "4000000000", emulated=False,
                      timeout=120)
    assert_usage_error(run, "--device-memory-mb 4000000000", "more than this machine's memory")


@pytest.mark.parametrize("name", SUPPORTED)
def test_stats_csv_must_name_a_file_in_an_existing_folder(name: str, tmp_path: Path) -> None:
    run = run_example(name, "--stats-csv", str(tmp_path), timeout=120)
    assert_usage_error(run, f"--stats-csv {tmp_path}", "is a directory")
    missing = tmp_path / "missing" / "run.csv"
    run = run_example(name, "--stats-csv", str(missing), timeout=120)
    assert_usage_error(run, f"--stats-csv {missing}", f"{missing.parent} does not exist")
    assert not missing.parent.exists()


def test_resnet50_stats_json_must_name_a_file_in_an_existing_folder(tmp_path: Path) -> None:
    run = run_example("resnet50_lms.py", "--stats-json", str(tmp_path), timeout=120,
                      emulated=False)
    assert_usage_error(run, f"--stats-json {tmp_path}", "is a directory")


@pytest.mark.parametrize("index, env, words", [
    ("5", {}, ("--worker-index 5", "TF_CONFIG is not set", "1 worker")),
    ("-1", {}, ("--worker-index -1",)),
    ("2", {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                        '"task": {"type": "worker", "index": 1}}'},
     ("--worker-index 2", "2 workers", "TF_CONFIG")),
    ("0", {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                        '"task": {"type": "worker", "index": 1}}'},
     ("--worker-index 0", "TF_CONFIG", "index 1")),
], ids=["no-tf-config", "negative", "past-the-cluster", "not-its-task"])
def test_multi_worker_refuses_a_worker_index_outside_the_cluster(index, env, words) -> None:
    run = run_example("multi_worker.py", "--worker-index", index, env=env, timeout=120)
    assert_usage_error(run, *words)
