"""Every problem of one policy file at once: YAML, schema and cross-file checks, placed.

``lint`` is what both ``speclane policy lint`` and ``load_policy`` (hence the gateway's hot
reload) run, so an operator sees the same lines in both places. When the schema fails, the
rest of the file is still checked (``policies/salvage.py``), so a typo or a wrongly typed
value does not hide a missing pool. Pure: takes text, not a path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from policies.checks import check
from policies.load import Positions, read, validate
from policies.model import ALIASES, PolicyFile
from policies.problems import Path, Problem, Severity, ordered
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
        checked = [*check(policy), *_aliased(got.raw)]
        found = [*got.problems, *_placed(checked, got.positions)]
        return Report(filename, tuple(ordered(found)), policy)
    found = [*got.problems, *problems, *_placed(salvaged(got.raw), got.positions)]
    return Report(filename, tuple(ordered(found)))


def _aliased(raw: dict[str, Any]) -> Iterator[Problem]:
    """Guardrail modes written by an older name (``policies/model.py``'s ``ALIASES``): read
    as the mode they name now, and said, so that the file can say it too."""
    places: list[tuple[Path, object]] = [(("guardrail",), raw.get("guardrail"))]
    rules = raw.get("rules")
    for i, rule in enumerate(rules if isinstance(rules, list) else ()):
        if isinstance(rule, dict):
            places.append((("rules", i, "guardrail"), rule.get("guardrail")))
    for at, guardrail in places:
        mode = guardrail.get("mode") if isinstance(guardrail, dict) else None
        if isinstance(mode, str) and mode in ALIASES:
            now = ALIASES[mode].value
            message = f"mode {mode!r} is an older name for {now!r}"
            hint = f"write mode: {now}"
            yield Problem((*at, "mode"), message, hint, Severity.WARNING, code="alias")


_AT_KEY = {"unused-flag"}  # problems about a key itself, not about its value


def _placed(problems: list[Problem], positions: Positions) -> list[Problem]:
    return [positions.place(p, key=p.code in _AT_KEY) for p in problems]
