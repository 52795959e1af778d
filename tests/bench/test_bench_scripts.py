"""Every benchmark script in ``bench/`` starts: ``--help`` runs its imports and its argument
parser, so a script broken by a change elsewhere fails here and not on the day someone
needs its numbers; and every option ``bench/RESULTS.md`` gives it is still one it takes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.results_commands import options_by_script

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
    source = script.read_text(encoding="utf-8")  # an option argparse.SUPPRESS hides is there
    cited = options_by_script().get(script, set())
    missing = [o for o in sorted(cited) if o not in done.stdout and f'"{o}"' not in source]
    assert not missing, f"bench/RESULTS.md gives {script.name} {missing}: not its options"
