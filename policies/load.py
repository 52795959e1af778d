"""Read a policy file's text into a ``PolicyFile``, keeping the line and column of every value.

YAML is composed into nodes (PyYAML keeps their marks), turned into plain values while the
position of every key and value is recorded by path, and validated by the pydantic models.
Every problem found comes back at once, placed in the file. Pure: takes text, not a path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from policies.model import PolicyFile
from policies.problems import Path, PolicyError, Problem, Severity

try:  # the C loader is much faster; fall back where libyaml is missing
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Positions:
    """1-based (line, column) of each key and each value, by path."""

    keys: dict[Path, tuple[int, int]]
    values: dict[Path, tuple[int, int]]

    def of(self, path: Path, *, key: bool = False) -> tuple[int, int]:
        """The place of ``path``, or of its nearest ancestor the file has."""
        table = self.keys if key else self.values
        for end in range(len(path), -1, -1):
            found = table.get(path[:end]) or self.values.get(path[:end])
            if found:
                return found
        return (1, 1)

    def place(self, problem: Problem, *, key: bool = False) -> Problem:
        line, column = self.of(problem.path, key=key)
        return Problem(problem.path, problem.message, problem.hint, problem.severity, line, column)


@dataclass(frozen=True, slots=True)
class Loaded:
    policy: PolicyFile
    positions: Positions
    raw: dict[str, Any]


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    """Turns composed YAML nodes into plain values, recording where each one stands."""

    def __init__(self) -> None:
        self.keys: dict[Path, tuple[int, int]] = {}
        self.values: dict[Path, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self._scalars = _Loader("")

    def close(self) -> None:
        self._scalars.dispose()

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.values[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalars.construct_object(node, deep=True)

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line, column = _mark(key_node)
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(
                    Problem(path, "a key must be a plain word", line=line, column=column)
                )
                continue
            key = str(self._scalars.construct_object(key_node))
            child = (*path, key)
            if key in out:
                self.problems.append(
                    Problem(child, f"duplicate key {key!r}", "keep one", line=line, column=column)
                )
            self.keys[child] = (line, column)
            out[key] = self.build(value_node, child)
        return out


def _compose(text: str, filename: str) -> yaml.Node:
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        message = f"not valid YAML: {exc.problem or exc}"
        raise PolicyError(filename, [Problem((), message, line=line, column=column)]) from None
    if node is None:
        raise PolicyError(filename, [Problem((), "the file is empty", line=1, column=1)])
    return node


def _message(error: Any) -> tuple[Path, str, str]:
    loc: Path = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        return loc, f"unknown key {loc[-1]!r}", ""
    if kind == "missing":
        return loc, f"{loc[-1]!r} is required", ""
    return loc, str(error["msg"]), ""


def _errors(exc: ValidationError, positions: Positions) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        path, message, hint = _message(error)
        path = _known_prefix(path, positions)
        problem = Problem(path, message, hint)
        problems.append(positions.place(problem, key=error["type"] == "extra_forbidden"))
    return problems


def _known_prefix(loc: Path, positions: Positions) -> Path:
    """Drop the parts pydantic adds for union members (``'literal['present']'``, ...)."""
    path: Path = ()
    for part in loc:
        candidate = (*path, part)
        unknown = candidate not in positions.values and candidate not in positions.keys
        if unknown and isinstance(part, str) and ("[" in part or part.startswith("function-")):
            continue
        path = candidate
    return path


def parse(text: str, filename: str = "<policy>") -> Loaded:
    """Parse and validate one policy file; raise ``PolicyError`` listing every error."""
    node = _compose(text, filename)
    builder = _Builder()
    try:
        raw = builder.build(node, ())
    finally:
        builder.close()
    positions = Positions(builder.keys, builder.values)
    problems = list(builder.problems)
    if not isinstance(raw, dict):
        problems.append(Problem((), "the file must be a mapping (version, pools, rules, ...)"))
        raise PolicyError(filename, [positions.place(p) for p in problems])
    try:
        policy = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(filename, problems + _errors(exc, positions)) from None
    errors = [p for p in problems if p.severity is Severity.ERROR]
    if errors:
        raise PolicyError(filename, errors)
    return Loaded(policy, positions, raw)
