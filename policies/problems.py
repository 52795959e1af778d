"""Problems found in a policy file, each with where it is and how to fix it. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

Path = tuple[str | int, ...]


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding; ``line`` and ``column`` are 1-based, 0 when the file has no such place."""

    path: Path
    message: str
    hint: str = ""
    severity: Severity = Severity.ERROR
    line: int = 0
    column: int = 0

    def render(self, filename: str) -> str:
        where = f"{filename}:{self.line}:{self.column}"
        dotted = ".".join(str(p) for p in self.path) or "<file>"
        text = f"{where}: {self.severity}: {dotted}: {self.message}"
        return f"{text} (hint: {self.hint})" if self.hint else text


class PolicyError(Exception):
    """A policy file that cannot be used; ``problems`` holds every error found."""

    def __init__(self, filename: str, problems: list[Problem]) -> None:
        self.filename = filename
        self.problems = problems
        super().__init__("\n".join(p.render(filename) for p in problems))
