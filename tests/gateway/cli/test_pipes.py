"""A reader that stops early (``speclane report | head -1``): the command ends quietly with
status 0, and the files it was asked to write are there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[3]
RECORDED = ROOT / "tests" / "report_fixtures" / "pilot.jsonl"


def closed_early(*args: str) -> tuple[int, str]:
    """Run ``speclane ARGS`` with its stdout a pipe whose reader is gone before it writes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"},
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    with process.stderr:
        err = process.stderr.read().decode()
    return process.wait(timeout=120), err


def test_report_into_a_closed_pipe_writes_its_json_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    code, err = closed_early("report", "--log", str(RECORDED), "--json", str(out))
    assert (code, err) == (0, "")
    assert out.read_text().startswith("{")


def test_plain_writes_into_a_closed_pipe_exit_0() -> None:
    code, err = closed_early("policy", "schema")
    assert (code, err) == (0, "")
