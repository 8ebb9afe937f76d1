"""benchmarks/policy.py's ratios: learned over the oracle and Belady, and the
oracle over Belady (what the engine's units cost with perfect predictions),
each the worst over the cases where both sides fit. Checked on rows of known
swap bytes, without TensorFlow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import policy  # noqa: E402


def case(name: str, fraction: int, swaps: dict[str, float | None]) -> list[tuple]:
    """Rows as replay_cases makes them; a swap of None: that policy did not fit."""
    return [(name, fraction, 100, p, s is not None, s or 0.0, 0, 0, 0) for p, s in swaps.items()]


def test_each_worst_ratio_is_taken_over_the_cases_where_both_sides_fit() -> None:
    rows = (case("a", 2, {"lru": 130.0, "learned": 110.0, "oracle": 100.0, "belady": 100.0})
            + case("b", 4, {"lru": 90.0, "learned": 99.0, "oracle": 108.0, "belady": 90.0})
            # The oracle does not fit: no ratio against it, nor of it against Belady.
            + case("c", 2, {"lru": 500.0, "learned": 500.0, "oracle": None, "belady": 100.0}))
    per_row, worst = policy.ratios(rows)
    assert worst == pytest.approx({"oracle": 1.1, "belady": 5.0, "oracle/belady": 1.2})
    by_policy = {(r[0], r[3]): ratio for r, ratio in zip(rows, per_row)}
    assert by_policy[("a", "learned")] == {"oracle": "1.10", "belady": "1.10"}
    assert by_policy[("b", "oracle")] == {"oracle": "", "belady": "1.20"}
    assert by_policy[("c", "learned")] == {"oracle": "", "belady": "5.00"}
    assert by_policy[("a", "lru")] == by_policy[("a", "belady")] == {"oracle": "", "belady": ""}
