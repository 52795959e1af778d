"""Problems found in a policy file, each with where it is and how to fix it. Pure.

``PolicyError`` is the one exception of the policy package: a file that cannot be used.
It carries every error found, so the gateway's reload log and ``speclane policy lint``
print the same lines.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

Path = tuple[str | int, ...]


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding; ``line`` and ``column`` are 1-based, 0 when the file has no such place.

    ``code`` names the kind of problem (``unknown-key``, ``shadowed-rule``, ...) for tools
    and tests; it is not printed.
    """

    path: Path
    message: str
    hint: str = ""
    severity: Severity = Severity.ERROR
    line: int = 0
    column: int = 0
    code: str = ""

    def render(self, filename: str) -> str:
        where = f"{filename}:{self.line}:{self.column}"
        text = f"{where}: {self.severity}: {dotted(self.path)}: {self.message}"
        return f"{text} (hint: {self.hint})" if self.hint else text

    def at(self, line: int, column: int) -> Problem:
        return replace(self, line=line, column=column)

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR


class PolicyError(Exception):
    """A policy file that cannot be used; ``problems`` holds every error found."""

    def __init__(self, filename: str, problems: list[Problem]) -> None:
        self.filename = filename
        self.problems = problems
        super().__init__("\n".join(p.render(filename) for p in problems))


def dotted(path: Path) -> str:
    """``('rules', 2, 'match')`` -> ``rules.2.match``; the whole file is ``<file>``."""
    return ".".join(str(p) for p in path) or "<file>"


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` was most likely meant to be (difflib), if one is close."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str], what: str = "known") -> str:
    """A hint naming the closest choice, or listing the choices when none is close."""
    options = sorted(set(choices))
    close = closest(word, options)
    if close:
        return f"did you mean {close!r}?"
    if options and len(options) <= 12:
        return f"{what}: " + ", ".join(options)
    return ""


def ordered(problems: Iterable[Problem]) -> list[Problem]:
    """Problems in file order (line, column), errors before warnings at one place."""
    return sorted(problems, key=lambda p: (p.line, p.column, not p.is_error, p.message))
