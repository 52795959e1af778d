"""Every problem of one policy file at once: YAML, schema and cross-file checks, placed.

``lint`` is what both ``speclane policy lint`` and ``load_policy`` (hence the gateway's hot
reload) run, so an operator sees the same lines in both places. When the schema fails, the
rest of the file is still checked (``policies/salvage.py``), so a typo or a wrongly typed
value does not hide a missing pool. Pure: takes text, not a path.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.checks import check
from policies.load import Positions, read, validate
from policies.model import PolicyFile
from policies.problems import Problem, ordered
from policies.salvage import salvaged


@dataclass(frozen=True, slots=True)
class Report:
    """What lint found in one file; ``policy`` is set when the schema validated."""

    filename: str
    problems: tuple[Problem, ...]
    policy: PolicyFile | None = None

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.is_error)

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if not p.is_error)

    def failed(self, *, strict: bool = False) -> bool:
        return bool(self.errors or (strict and self.warnings))

    def lines(self) -> list[str]:
        return [p.render(self.filename) for p in self.problems]


def lint(text: str | bytes, filename: str = "<policy>") -> Report:
    """Read, validate and check one policy file; every problem, in file order."""
    got = read(text)
    if not isinstance(got.raw, dict):
        return Report(filename, tuple(ordered(got.problems)))
    policy, problems = validate(got.raw, got.positions)
    if policy is not None:
        found = [*got.problems, *_placed(check(policy), got.positions)]
        return Report(filename, tuple(ordered(found)), policy)
    found = [*got.problems, *problems, *_placed(salvaged(got.raw), got.positions)]
    return Report(filename, tuple(ordered(found)))


_AT_KEY = {"unused-flag"}  # problems about a key itself, not about its value


def _placed(problems: list[Problem], positions: Positions) -> list[Problem]:
    return [positions.place(p, key=p.code in _AT_KEY) for p in problems]
