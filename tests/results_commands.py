"""The commands ``bench/RESULTS.md`` cites, parsed: what each runs, from where, with which
options and paths (``tests/test_results.py``, ``tests/bench/test_bench_scripts.py``)."""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]{2,}")  # DIR, OLD_CHECKOUT, VLLM_VENV/bin/python
PYTHONS = {"python", "python3"}
REPOSITORY_MODULES = {"bench", "gateway", "backends"}


class Step(NamedTuple):
    """One program a command runs: ``script`` (a repository file, or None for a tool or a
    ``speclane`` command), and the arguments after it."""

    command: str
    cwd: Path
    argv: list[str]
    script: Path | None
    rest: list[str]

    def options(self) -> list[str]:
        return [word.split("=", 1)[0] for word in self.rest if word.startswith("--")]

    def repository_paths(self) -> list[Path]:
        """The arguments that name a file of the repository (not placeholders, not /tmp)."""
        out = []
        for word in self.rest:
            if word.startswith(("-", "/")) or PLACEHOLDER.search(word) or "/" not in word:
                continue
            if Path(word).suffix in {".py", ".yaml", ".csv", ".json", ".md"}:
                out.append((self.cwd / word).resolve())
        return out


def commands(text: str) -> list[str]:
    """Every command of a page: the lines of its fenced blocks, its indented code lines (the
    tables ``decision_quality.py --write`` keeps) and the inline commands the fault suite
    lists; a backslash continues a line."""
    found: list[str] = []
    fenced = False
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    .venv/"):
            found.append(" ".join(line.split()))
        else:
            found += re.findall(r"`((?:python -m bench\.|\.venv/bin/)[^`]+)`", line)
    return [command for command in found if command and not command.startswith("#")]


def steps(command: str) -> list[Step]:
    """A command as the programs it runs: ``cd X &&`` moves, ``&&`` and ``;`` separate,
    leading ``NAME=value`` assignments are dropped."""
    cwd, out = ROOT, []
    for part in re.split(r"&&|;", command):
        argv = shlex.split(part, comments=True)
        while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
            argv = argv[1:]
        if not argv:
            continue
        if argv[0] == "cd":
            cwd = (cwd / argv[1]).resolve()
            continue
        script, rest = _script(cwd, argv)
        out.append(Step(command, cwd, argv, script, rest))
    return out


def _script(cwd: Path, argv: list[str]) -> tuple[Path | None, list[str]]:
    if argv[0] in PYTHONS or argv[0].endswith("/bin/python"):
        if argv[1] == "-m":
            if argv[2].split(".")[0] in REPOSITORY_MODULES:
                return ROOT / (argv[2].replace(".", "/") + ".py"), argv[3:]
            return None, argv[3:]  # pytest, venv, pip
        if argv[1].endswith(".py"):
            return (cwd / argv[1]).resolve(), argv[2:]
    return None, argv[1:]


def cited() -> list[Step]:
    return [step for command in commands(RESULTS.read_text()) for step in steps(command)]


def options_by_script() -> dict[Path, set[str]]:
    """The options RESULTS.md gives each repository script."""
    out: dict[Path, set[str]] = defaultdict(set)
    for step in cited():
        if step.script is not None:
            out[step.script].update(step.options())
    return out
