"""``bench/gpu/steptime.py`` runs end to end on the CPU, with the tiny shape: the same code
path a GPU run takes (models built from a ``LlamaConfig``, the attention variants checked
and chosen, the loop checked against transformers' own forward, the arena, the cells, the
CSV, the summary, the report), so it is known to run before it meets a GPU.

It needs torch and transformers, which speclane's own venv does not have; the real-vLLM
tier's venv has both (vLLM's CPU build brings torch's CPU build and transformers), so the
test runs there, installing that venv first when it is missing (no stack is started).
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from gateway.cli.localvllm import install

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # a cold venv install included

SCRIPT = Path(__file__).parents[2] / "bench" / "gpu" / "steptime.py"
FAST = ["--warmup", "1", "--min-reps", "2", "--max-reps", "2", "--target-ms", "1"]


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("install") / "install.log"
    return install.ensure(install.venv_path(install.default_cache()), log)


def steptime(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(python), str(SCRIPT), "--shape", "tiny", "--device", "cpu", *FAST, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_a_tiny_run_measures_skips_and_survives_running_out_of_memory(python, tmp_path):
    # an arena that holds B <= 4 at L=256 but B=64 at L=16; B=64 then "runs out of memory"
    done = steptime(
        python,
        *("--out", str(tmp_path), "--batches", "1,2,4,16,64", "--queries", "1,3,5,8"),
        *("--contexts", "256,16", "--arena-gib", "0.00056", "--inject-oom-at-batch", "64"),
    )
    with (tmp_path / "steptime.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 5 * (4 + 1)
    status = {(r["role"], int(r["batch"]), int(r["context"]), int(r["q"])): r for r in rows}
    for key, row in status.items():
        role, batch, context, _ = key
        # the draft's cache is a quarter of the target's: its B=16 fits at L=256
        if context == 256 and batch >= (16 if role == "target" else 64):
            assert row["status"] == "skipped-memory", row
        elif batch == 64 and context == 16:
            assert row["status"] == "oom", row
        else:
            assert row["status"] == "ok", row
            assert 0 < float(row["ms_p10"]) <= float(row["ms_median"]) <= float(row["ms_p90"])
            assert row["mode"] == "eager" and int(row["reps"]) == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["meta"]["torch"] and summary["meta"]["transformers"]
    assert summary["attention"]["chosen"] in summary["attention"]["ms"]
    assert summary["attention"]["failed"] == {}
    for name in ("tiny", "tiny-draft"):
        check = summary["checks"][name]
        assert check["ok"] and check["relative_error"] < 1e-4, check
    assert summary["cells"] == {"ok": 36, "skipped-memory": 9, "oom": 5}
    model = summary["cost_model"]
    assert model["target"]["floor_s"] > 0 and model["draft"]["shape"] == "tiny-draft"
    assert "measured: " in model["source"]
    analysis = summary["analysis"]["tiny"]
    assert set(analysis["verify_over_plain"]) == {"256", "16"}
    assert set(analysis["k4_stops_paying"]["16"]) == {"0.5", "0.7", "0.85"}
    out = done.stdout
    assert "verify / plain" in out and "stops paying" in out and "B <= 16" in out
    assert "tiny  target L=   16 B= 64 q=1: oom" in out


def test_a_spent_budget_records_every_cell_as_skipped(python, tmp_path):
    steptime(python, "--out", str(tmp_path), "--budget-s", "0", "--contexts", "32")
    with (tmp_path / "steptime.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9 * (5 + 1)
    assert {r["status"] for r in rows} == {"skipped-budget"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cells"] == {"skipped-budget": 54}


def test_a_mixture_target_with_an_eagle_head_runs_checked(python, tmp_path):
    # the MoE target (grouped experts where torch computes them as the loop does) and an
    # EAGLE-3 head as its draft, each checked before timing
    done = steptime(
        python,
        *("--shape", "tiny-moe", "--draft", "eagle3", "--out", str(tmp_path)),
        *("--batches", "1,4,16", "--queries", "1,5", "--contexts", "64"),
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cells"] == {"ok": 3 * (2 + 1)}
    assert summary["experts"]["chosen"] in ("grouped", "looped")
    if summary["experts"]["chosen"] == "looped":
        assert summary["experts"]["failed"]["grouped"]
    for name in ("tiny-moe", "tiny-eagle3"):
        check = summary["checks"][name]
        assert check["ok"] and check["relative_error"] < 1e-4, check
        assert check["cached_against_whole"]["ok"] and check["dense_form"]["ok"]
    shapes = summary["shapes"]
    assert shapes["tiny-moe"]["active_params"] < shapes["tiny-moe"]["params"]
    with (tmp_path / "steptime.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["shape"], r["role"]) for r in rows} == {
        ("tiny-moe", "target"),
        ("tiny-eagle3", "draft"),
    }
    assert "where a k=4 step stops paying (draft: tiny-eagle3)" in done.stdout
