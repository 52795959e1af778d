"""Every benchmark script in ``bench/`` starts: ``--help`` runs its imports and its argument
parser, so a script broken by a change elsewhere fails here and not on the day someone
needs its numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OWN_VENV = {"tokens.py"}  # runs in a venv of its own, with a tokenizer (its docstring)
SCRIPTS = sorted(
    path
    for path in (ROOT / "bench").glob("*.py")
    if path.name not in OWN_VENV and "argparse" in path.read_text(encoding="utf-8")
)


def test_there_are_scripts():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_the_script_answers_help(script: Path):
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
