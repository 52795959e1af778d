"""``bench/decision_quality.py``'s table: one row per scenario and cost model, with what
exploring cost the scenario and its dearest cell."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "decision_quality", ROOT / "bench" / "decision_quality.py"
    )
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("decision_quality", loaded)
    spec.loader.exec_module(loaded)
    return loaded


def summary(share: float, worst: float) -> dict[str, Any]:
    verdict = {
        "adaptive_vs_oracle": 1.01,
        "adaptive_vs_always_standard": 0.7,
        "adaptive_vs_always_speculative": 0.95,
        "best_static_vs_oracle": 1.0,
        "worst_cell_vs_always_standard": 1.02,
        "worst_cell": "chat/calm",
    }
    return {
        "scenario": "steady-mix",
        "cost_model": "gpu-32b",
        "requests": 100,
        "verdict": verdict,
        "exploration": {"share": share, "worst_cell": worst, "worst_cell_name": "json/all"},
    }


def test_the_table_says_what_exploring_cost():
    dq = module()
    text = dq.table("t", "cmd", [[summary(0.004, 0.012), summary(0.006, 0.018)]])
    head, rule, row = text.splitlines()[4:7]
    assert "exploration (worst cell)" in head
    assert head.count("|") == rule.count("|") == row.count("|")
    assert "| 0.5% (1.5% json/all) |" in row
