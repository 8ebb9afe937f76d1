"""Progress lines of the benchmarks' probes (benchmarks/probe_process.py).

A probe is a real subprocess; these run short ones (a sleeping Python) with a
short progress interval, so the lines a multi-minute ResNet-50 probe prints
every 30 seconds appear within seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import probe_process  # noqa: E402

pytestmark = pytest.mark.quick


@pytest.fixture
def every_half_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_process, "progress_every", 0.5)


def sleeper(seconds: float, code: int = 0) -> list[str]:
    return [sys.executable, "-c",
            f"import sys, time; time.sleep({seconds}); print('why', file=sys.stderr); "
            f"sys.exit({code})"]


def test_a_running_probe_prints_a_start_line_then_lines_while_it_runs(every_half_second,
                                                                     capsys):
    done = probe_process.run_probe_process(sleeper(2.2, code=3), None, timeout=60,
                                           label="lms batch 64", estimate=40)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("  lms batch 64: running, estimate ~40 s (elapsed 0:")
    still = [line for line in lines if "still running" in line]
    assert 3 <= len(still) <= 5, lines
    assert still[0].startswith("  lms batch 64: still running, 0 s") or \
        still[0].startswith("  lms batch 64: still running, 1 s")
    assert done.returncode == 3 and not done.timed_out
    assert done.stderr.strip() == "why" and 2.0 < done.seconds < 30


def test_a_probe_past_its_timeout_is_killed_and_says_so(every_half_second, capsys):
    done = probe_process.run_probe_process(sleeper(60), None, timeout=1.5, label="bfc batch 8")
    assert done.timed_out and done.returncode == -9
    assert 1.5 <= done.seconds < 10
    assert "bfc batch 8: running (elapsed" in capsys.readouterr().out
