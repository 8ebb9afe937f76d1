"""benchmarks/overhead_paired.py's arithmetic and overhead.py's refusals.

The paired benchmark sets each capped phase against the uncapped phase of its
own block: per block (capped step - uncapped step) / copy floor, the case's
figure the median of its blocks, the last line the worst case. Checked on
blocks of known steps, without TensorFlow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import overhead_paired  # noqa: E402

MIB = 1 << 20


def phase(seconds: list[float], moved: float, evicting_ms: float = 0.0) -> list[dict]:
    zero = {key: 0.0 for key in overhead_paired.COUNTED}
    return [{**zero, "seconds": s, "bytes_copied": moved, "time_evicting_ns": evicting_ms * 1e6}
            for s in seconds]


def test_each_block_is_set_against_its_own_uncapped_phase(capsys) -> None:
    bandwidth = 1e9  # 100 MB moved a step: a 0.1 s floor
    blocks = {
        # The second block runs 1 s slower throughout: a slow spell of the machine.
        "uncapped": [phase([1.0, 1.0, 1.2], 0), phase([2.0, 2.0, 2.0], 0)],
        "1/2": [phase([1.1, 1.1, 1.0], 1e8, 50.0), phase([2.2, 2.2, 2.3], 1e8, 50.0)],
    }
    overheads = overhead_paired.report_model("m", 400, 500, {"1/2": 200}, blocks, bandwidth)
    # Block medians: uncapped 1.0 and 2.0, capped 1.1 and 2.2: (0.1 / 0.1, 0.2 / 0.1).
    assert overheads == pytest.approx([1.5])
    out = capsys.readouterr().out
    assert "per block 1.0, 2.0  overhead_vs_copy_floor 1.5" in out
    assert "accounted 0.5x" in out and "blocks 1.10x, 1.10x" in out
    # The uncapped blocks (1.0 and 2.0 s) lie 10 floors of 0.1 s apart.
    assert "uncapped spread 10.0 floors  per block" in out
    assert "evictions 0" in out
    assert "waiting for the lock 0.0, for moves 0.0; planning 0.0" in out


def test_a_phase_that_moves_nothing_has_no_overhead(capsys) -> None:
    blocks = {"uncapped": [phase([1.0], 0)], "1/2": [phase([1.0], 0)]}
    assert overhead_paired.report_model("m", 400, 500, {"1/2": 200}, blocks, 1e9) == []
    assert "moved no bytes" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--paired", "--huge-pages", "both"], "--paired runs as this machine allows"),
    (["--paired", "--blocks", "0"], "--blocks 0: at least 1"),
    (["--policy", "fifo"], "argument --policy: invalid choice: 'fifo'"),
])
def test_overhead_refuses_what_cannot_run(args: list[str], message: str) -> None:
    run = subprocess.run([sys.executable, str(BENCHMARKS / "overhead.py"), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_the_policy_chosen_reaches_every_lms_process(monkeypatch) -> None:
    import overhead

    settings: list[dict | None] = []

    def probe(script, model, cap_mb, steps, timeout, mode="lms", extra=None):
        settings.append(extra)
        return None, "not run"

    monkeypatch.setattr(overhead, "run_probe_script", probe)
    monkeypatch.setattr(overhead_paired, "run_probe_script",
                        lambda *args, settings=None: probe(*args, extra=settings))
    monkeypatch.setattr(overhead_paired, "run_case",
                        lambda model, cap, steps, timeout, mode: overhead.Case(
                            model, cap, [1.0], {}, 100.0))
    assert overhead.run_case("m", 200, 3, 60, policy="lru").failed == "not run"
    assert overhead_paired.main(["resnet50"], 1, 3, 60, 1e9, policy="lru") == 1
    assert overhead.run_case("m", 200, 3, 60, huge_pages="off").failed == "not run"
    assert settings[0] == {"TF_LMS_POLICY": "lru"}
    assert settings[1]["TF_LMS_POLICY"] == "lru" and overhead_paired.PLAN in settings[1]
    assert settings[2] == {"TF_LMS_HUGE_PAGES": "off"}  # LMS's default policy
