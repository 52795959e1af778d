"""``bench/crossover.py``'s parts that need no replay: the static policy it serves the
scenario's traffic with, and how it counts windows whose first token was slow."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from crossover import over, policies  # noqa: E402


def test_always_standard_starts_every_rule_on_the_standard_pool():
    text = (BENCH / "policies" / "eagle3.yaml").read_text()
    served = policies(text)
    assert {r.rule.start for r in served["adaptive"].rules} == {"spec"}
    assert {r.rule.start for r in served["always-standard"].rules} == {"standard"}


def test_slow_windows_are_counted_with_their_longest_run():
    standard = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    adaptive = {0: 1.6, 1: 1.4, 2: 1.6, 3: 2.0, 4: 1.0, 5: 9.0}  # window 5: no standard one
    assert over(adaptive, standard) == (3, 2)
    assert over(standard, standard) == (0, 0)
