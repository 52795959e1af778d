"""The GPU step-time benchmark's pure half (``bench/gpu/stepcurve.py``): shapes and their
memory, the grid's order, and the analyses, on tables shaped like a GPU's step curve; and the
script's torch-free entry points (``--plan``, ``--analyse``) in this venv, which has no torch.
The torch path itself runs on the CPU in the real-vLLM tier (its venv has torch)."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "steptime.py"
sys.path.insert(0, str(SCRIPT.parent))

import stepcurve as sc  # noqa: E402

# An H100-like 8B curve and its 1B draft, in ms (the shape the issue expects, not a reading)
TARGET = sc.Hinge(floor_ms=6.0, per_token_ms=0.027, knee_tokens=220.0, kv_per_token_ms=4.4e-5)
DRAFT = sc.Hinge(floor_ms=1.3, per_token_ms=0.005, knee_tokens=260.0, kv_per_token_ms=1.1e-5)


def curve_cells(noise: float = 0.0) -> list[sc.Cell]:
    cells = []
    for i, spec in enumerate(sc.grid("8b", "1b", sc.BATCHES, sc.QUERIES, sc.CONTEXTS)):
        hinge = TARGET if spec.role == "target" else DRAFT
        ms = hinge.ms(spec.batch * spec.q, spec.batch * spec.context)
        ms *= 1 + noise * math.sin(7.3 * i)
        cells.append(sc.Cell(spec.shape, spec.role, spec.batch, spec.q, spec.context, "ok", ms))
    return cells


def test_shapes_are_the_models_they_stand_for():
    assert sc.SHAPES["8b"].params() == pytest.approx(8.03e9, rel=0.005)
    assert sc.SHAPES["1b"].params() == pytest.approx(1.236e9, rel=0.005)
    assert sc.SHAPES["32b"].params() == pytest.approx(32.8e9, rel=0.01)
    assert sc.SHAPES["8b"].kv_bytes_per_token() == 128 * 1024
    # 8B at B=256, L=8192: ~275 GB of cache, which no single card holds
    assert sc.kv_elements(sc.SHAPES["8b"], 256, 8192, 1) * 2 == pytest.approx(275e9, rel=0.01)
    config = sc.SHAPES["8b"].llama_config()
    assert config["num_key_value_heads"] == 8 and config["intermediate_size"] == 14336


def test_the_mixture_and_the_eagle_head_are_the_models_they_stand_for():
    moe = sc.SHAPES["30b-a3b"]
    # Qwen3-30B-A3B: 30.5B parameters, 3.3B of them active for a token
    assert moe.params() == pytest.approx(30.5e9, rel=0.01)
    assert moe.active_params() == pytest.approx(3.3e9, rel=0.03)
    assert moe.kv_bytes_per_token() == 2 * 48 * 4 * 128 * 2
    # a step reads the experts its tokens chose: a token's eight, a full batch nearly all
    assert moe.weight_bytes_read(1) == pytest.approx(2 * moe.active_params(), rel=1e-9)
    reads = [moe.weight_bytes_read(t) for t in (1, 8, 64, 1024)]
    assert reads == sorted(reads) and reads[-1] == pytest.approx(moe.weight_bytes(), rel=1e-6)
    assert moe.flops_per_token() < 2 * moe.active_params()
    for target, head in sc.EAGLE_FOR.items():
        assert sc.SHAPES[head].hidden == sc.SHAPES[target].hidden and sc.SHAPES[head].fused == 3
    eagle = sc.SHAPES["eagle3-8b"]
    # one layer at 8B's width, an fc from three of its layers' states, a 32k-token LM head
    layer = 2 * 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    assert eagle.params() == layer + 3 * 4096**2 + 2 * 4096 + 32000 * 4096
    assert 0.4e9 < eagle.params() < 0.45e9 and eagle.layers == 1
    assert sc.SHAPES["8b"].weight_bytes_read(64) == sc.SHAPES["8b"].weight_bytes()
    assert sc.DRAFT_FOR["30b-a3b"] == "eagle3-30b-a3b"


def test_the_grid_measures_what_matters_first():
    specs = sc.grid("8b", "1b", sc.BATCHES, sc.QUERIES, sc.CONTEXTS)
    assert len(specs) == 3 * 9 * (5 + 1)
    first = [(s.role, s.batch, s.q, s.context) for s in specs[:6]]
    assert first == [("target", 1, q, 2048) for q in (1, 5, 3, 8, 2)] + [("draft", 1, 1, 2048)]
    assert [s.context for s in specs[::54]] == [2048, 512, 8192]
    assert {s.context for s in specs[:54]} == {2048}
    assert all(s.q == 1 for s in specs if s.role == "draft")
    assert sc.grid("tiny", None, (4, 1), (2, 1), (16,))[0] == sc.Spec("tiny", "target", 1, 1, 16)


def test_percentiles_and_csv_round_trip(tmp_path):
    assert sc.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert sc.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 10) == pytest.approx(1.4)
    assert math.isnan(sc.percentile([], 50))
    cells = curve_cells()[:7] + [sc.Cell("8b", "target", 256, 8, 8192, "skipped-memory", note="x")]
    path = tmp_path / "steptime.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sc.CSV_FIELDS)
        writer.writeheader()
        writer.writerows(sc.cell_row(c) for c in cells)
    back = sc.read_cells(str(path))
    assert [(c.batch, c.q, c.status) for c in back] == [(c.batch, c.q, c.status) for c in cells]
    assert back[0].ms_median == pytest.approx(cells[0].ms_median, abs=1e-4)
    assert math.isnan(back[-1].ms_median) and not back[-1].ok


def test_verify_ratios_follow_the_curve():
    ratios = sc.verify_ratios(sc.table(curve_cells()), "8b")
    # memory-bound at B=1: verifying 4 drafts costs about what a plain step does
    assert ratios[2048][1][4] == pytest.approx(1.0, abs=0.01)
    # compute-bound at B=256: 5 tokens a sequence cost far more than 1
    assert ratios[512][256][4] > 3.0
    assert ratios[512][256][7] > ratios[512][256][4] > ratios[512][256][2]


def test_break_even_brackets_the_crossing():
    be = sc.break_even({1: 2.0, 2: 1.5, 4: 1.2, 8: 0.8, 16: 0.5})
    assert be.batch == 8 and 4 < (be.crossing or 0) < 8
    assert "stops at" in be.describe()
    assert sc.break_even({1: 2.0, 256: 1.1}).batch is None
    assert "pays up to B=256" in sc.break_even({1: 2.0, 256: 1.1}).describe()
    never = sc.break_even({1: 0.9, 2: 0.8})
    assert never.batch == 1 and "never pays" in never.describe()
    assert sc.break_even({}).describe() == "no data"


def test_speculation_stops_paying_later_with_better_acceptance_and_free_drafts():
    tab = sc.table(curve_cells())
    crossings = {}
    for a in sc.ACCEPTANCES:
        sp = sc.speedups(tab, "8b", "1b", 2048, a)
        assert sp["draft_model"][1] < sp["ngram"][1]  # the draft's steps cost something
        crossings[a] = sc.break_even(sp["draft_model"])
        tokens = sc.expected_tokens_per_step(a, 4)
        plain, verify = TARGET.ms(1, 2048), TARGET.ms(5, 2048)
        assert sp["ngram"][1] == pytest.approx(tokens * plain / verify)
    assert crossings[0.5].batch is not None
    assert (crossings[0.5].crossing or 0) < (crossings[0.85].crossing or math.inf)


def test_a_line_over_small_batches_misses_the_knee():
    misses = sc.line_misses(sc.table(curve_cells()), "8b", "target")
    at_256 = misses[512][5].misses[256]
    measured, predicted = at_256
    assert measured / predicted > 2.0  # flat up to 16, steep past the knee
    assert set(misses[8192][1].misses) <= {64, 256}
    assert sc.fit_line([(1.0, 2.0), (2.0, 3.0), (4.0, 5.0)]) == pytest.approx((1.0, 1.0))
    assert sc.fit_line([(1.0, 2.0), (1.0, 3.0)]) is None


def test_the_cost_model_is_recovered_from_a_measured_table():
    fitted = sc.fit_cost_model(curve_cells(noise=0.02), "8b", "1b")
    target, draft = fitted["target"], fitted["draft"]
    assert isinstance(target, dict) and isinstance(draft, dict)
    assert target["floor_s"] == pytest.approx(0.006, rel=0.05)
    assert target["per_token_s"] == pytest.approx(0.027e-3, rel=0.1)
    assert target["knee_tokens"] == pytest.approx(220, rel=0.3)
    assert target["kv_per_token_s"] == pytest.approx(4.4e-8, rel=0.1)
    assert target["max_rel_error"] < 0.06
    assert draft["floor_s"] == pytest.approx(0.0013, rel=0.05)
    assert sc.fit_hinge([(1, 1, 512, 5.0)]) is None


def test_a_memory_bound_slope_and_an_attention_floor_are_recovered_too():
    # a slope below the knee, and one sequence's attention as slow as sixteen's
    truth = sc.Hinge(7.5, 0.03, 230.0, 4.5e-5, low_per_token_ms=0.015, kv_min_seqs=16.0)
    points = [
        (s.batch, s.q, s.context, truth.ms(s.batch * s.q, s.batch * s.context, s.batch))
        for s in sc.grid("8b", None, sc.BATCHES, sc.QUERIES, sc.CONTEXTS)
    ]
    fitted = sc.fit_hinge(points)
    assert fitted is not None
    hinge, worst = fitted
    assert worst < 1e-3
    assert hinge.low_per_token_ms == pytest.approx(0.015, rel=0.01)
    assert hinge.kv_min_seqs == pytest.approx(16.0, rel=0.01)
    assert hinge.knee_tokens == pytest.approx(230.0, rel=0.01)
    # the same cells under the four-parameter form (no floor for attention): a third off
    flat = sc.Hinge(7.5, 0.03, 230.0, 4.5e-5, low_per_token_ms=0.015)
    assert max(abs(e) for e in sc.rel_errors(flat, points)) > 0.3


def test_the_report_prints_every_analysis():
    cells = curve_cells()
    cells.append(sc.Cell("8b", "target", 512, 8, 8192, "skipped-memory"))
    text = "\n".join(sc.report(cells, "8b", "1b"))
    assert "verify / plain" in text and "stops paying" in text and "B <= 16" in text
    assert "decode speed-up over plain decoding, by batch" in text
    assert "the GPU cost model fitted" in text and "relative error over 135 cells" in text
    summary = sc.analysis(cells, "8b", "1b")
    assert set(summary) == {
        "verify_over_plain",
        "k4_stops_paying",
        "line_fit_small_batches",
        "cost_model",
    }


def test_the_script_plans_and_analyses_without_torch(tmp_path):
    env_python = sys.executable
    plan = subprocess.run(
        [env_python, str(SCRIPT), "--plan"], capture_output=True, text=True, timeout=60
    )
    assert plan.returncode == 0, plan.stderr
    assert "skip" in plan.stdout and "cells' wall time" in plan.stdout
    moe = subprocess.run(
        [env_python, str(SCRIPT), "--plan", "--shape", "30b-a3b", "--draft", "eagle3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert moe.returncode == 0, moe.stderr
    assert "30b-a3b target" in moe.stdout and "eagle3-30b-a3b draft" in moe.stdout
    path = tmp_path / "steptime.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sc.CSV_FIELDS)
        writer.writeheader()
        writer.writerows(sc.cell_row(c) for c in curve_cells())
    again = subprocess.run(
        [env_python, str(SCRIPT), "--analyse", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr
    assert "where a k=4 step stops paying" in again.stdout
    bad = subprocess.run(
        [env_python, str(SCRIPT), "--shape", "70b", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown shape" in bad.stderr
