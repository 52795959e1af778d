"""``bench/gpu/learners.py``: the guardrail's step-time learners against the measured H200
table, printed as Markdown tables (``bench/RESULTS.md`` quotes the first)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

import learners  # noqa: E402


def test_both_tables_cover_every_target_and_context(capsys):
    assert learners.main([]) == 0
    out = capsys.readouterr().out
    first, second = out.split("Seen at B = 1..16")
    rows = [line for line in first.splitlines() if line.startswith(("| 8b", "| 32b"))]
    assert len(rows) == 2 * 3 * 2  # two targets, three contexts, two learners
    assert sum("| HingeFit |" in r for r in rows) == 6
    later = [line for line in second.splitlines() if line.startswith(("| 8b", "| 32b"))]
    assert len(later) == 6
    # an 8k context held no 32B batch of 64 or more: those cells say so
    assert any(r.startswith("| 32b | 8192 |") and "/ - /" in r for r in later)
