"""Every command ``bench/RESULTS.md`` cites still runs as written: the script, module or
``speclane`` command it names exists, every repository path it passes exists, and every
option it gives a ``speclane`` command or a script is one that command's ``--help`` lists
(for the scripts of ``bench/*.py``, ``tests/bench/test_bench_scripts.py`` checks their
options in the same ``--help`` it runs). A figure whose command is gone is a figure nobody
can regenerate."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from gateway.cli.main import main
from tests.results_commands import ROOT, Step, cited, commands, steps

# A script that runs in an interpreter of its own (its docstring says which), whose imports
# this venv lacks: its options are read from its source.
OWN_INTERPRETER = {ROOT / "bench" / "tokens.py"}
INSTALLERS = ("apt-get", "pip")


def speclane_help(words: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*words, "--help"])
    return out.getvalue()


def problems(step: Step) -> list[str]:
    """What is wrong with one program a command runs; nothing when it would run."""
    if step.argv[0].endswith(INSTALLERS) or step.argv[1:3] in (["-m", "venv"], ["-m", "pip"]):
        return []  # installing a tool the section names
    found = [f"{p.relative_to(ROOT)} is missing" for p in step.repository_paths() if not p.exists()]
    if step.argv[1:3] == ["-m", "pytest"]:
        return found + [f"{p} is missing" for p in step.rest if not (step.cwd / p).exists()]
    if step.argv[0].endswith("speclane"):
        words = [word for word in step.rest if not word.startswith("-")][:2]
        text = speclane_help(words[:1])
        if len(words) == 2 and f"    {words[1]}" in text:  # a sub-command of its own
            text = speclane_help(words)
        return found + [f"speclane has no {o}" for o in step.options() if o not in text]
    if step.script is None:
        return [*found, "not a command this test can check"]
    if not step.script.exists():
        return [*found, f"{step.script.relative_to(ROOT)} is missing"]
    if step.script in OWN_INTERPRETER:
        source = step.script.read_text()
        return found + [f"no {o}" for o in step.options() if f'"{o}"' not in source]
    if step.script.parent != ROOT / "bench" and step.options():  # bench/gpu/
        text = subprocess.run(
            [sys.executable, str(step.script), "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        return found + [f"no {o}" for o in step.options() if o not in text]
    return found


def test_every_cited_command_names_what_exists():
    cited_steps = cited()
    assert len(cited_steps) >= 15
    assert {ROOT / "bench" / "proxies.py", ROOT / "bench" / "faults.py"} <= {
        step.script for step in cited_steps
    }
    wrong = [f"{s.command}: {p}" for s in cited_steps for p in problems(s)]
    assert not wrong, "\n".join(wrong)


def test_a_missing_script_path_or_option_is_caught():
    page = (
        "```sh\n.venv/bin/python bench/no_such.py\n"
        ".venv/bin/speclane replay --policy bench/policies/no_such.yaml --no-such\n"
        "cd bench && ../.venv/bin/python parity.py --policy policies/mixed.yaml\n```\n"
    )
    found = [p for command in commands(page) for step in steps(command) for p in problems(step)]
    assert found == [
        "bench/no_such.py is missing",
        "bench/policies/no_such.yaml is missing",
        "speclane has no --no-such",
    ]
