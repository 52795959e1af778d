"""``bench/first_tokens.py``'s parts that need no replay: each class's first tokens per
window, only where it had enough requests, compared with always-standard's class by class."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from first_tokens import MIN_REQUESTS, by_class, compare  # noqa: E402

from gateway.replay.run import Row  # noqa: E402


def row(traffic: str, arrival: float, ttft: float) -> Row:
    return Row(
        0, traffic, 0, "all", "s", "r", "spec", 0, False, False, arrival, "", first=arrival + ttft
    )


def test_a_window_counts_only_with_enough_requests_of_the_class() -> None:
    rows = [row("chat", 1.0 + i, 0.25 * (i + 1)) for i in range(MIN_REQUESTS)]
    rows += [row("json", 2.0, 9.0)] * (MIN_REQUESTS - 1)  # too few in its window
    rows += [row("chat", 31.0, 5.0)]  # window 1: one request
    assert by_class(rows, 30.0) == {"chat": {0: 0.5}, "json": {}}


def test_classes_are_compared_with_their_own_first_tokens_on_standard() -> None:
    adaptive = {"chat": {0: 1.6, 1: 1.7, 2: 1.0, 3: 1.7}, "json": {0: 0.8, 5: 9.0}}
    standard = {"chat": {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, "json": {0: 0.1}}
    above, compared, longest, worst, where = compare(adaptive, standard, 30.0)
    assert (above, compared, longest) == (4, 5, 2)  # json's window 5 has no standard one
    assert (round(worst, 6), where) == (8.0, "json at 0 s")
    assert compare(standard, standard, 30.0)[:3] == (0, 5, 0)


def test_a_gap_under_the_rules_floor_is_not_a_slow_window() -> None:
    adaptive, standard = {"json": {0: 0.3, 1: 0.7}}, {"json": {0: 0.1, 1: 0.1}}
    assert compare(adaptive, standard, 30.0)[:3] == (1, 2, 1)  # 3x, but 0.2 s: not slow
    assert compare(adaptive, standard, 30.0, floor=0.0)[:3] == (2, 2, 2)
