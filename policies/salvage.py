"""The cross-file checks of a policy whose schema failed: every problem in one pass.

Lint validates the file; where values are wrong it still wants to say that a rule's
``start`` names no pool, so an operator fixes everything in one go. ``salvaged`` removes the
broken parts from a copy (a key whose value is wrong or unknown; a whole rule when anything
in it is wrong; the mapping around a key that is then missing, such as a pool without its
``kind``), validates what is left, runs the cross-file checks on it and maps each problem's
path back to the file. It drops what the removal could have caused rather than risk a false
line: problems inside a mapping that lost a key, problems naming a removed pool, flag or
tenant, the ladder's and models' problems once a pool is gone, the missing default when the
last rule is gone, and unused flags once a rule is gone. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from policies import schema
from policies.checks import check
from policies.model import PolicyFile
from policies.problems import Path, Problem, closest

MAX_ROUNDS = 8  # each round removes at least one more place; the schema is not deeper
_NAMED = ("pools", "flags", "tenants")
_AFTER_POOL = {"ladder", "model", "engine-threshold", "engine-method"}
_LADDERS = {"pools", "ladder", "ladders"}
_AFTER_LADDER = _AFTER_POOL | {"unknown-pool", "arms"}


@dataclass(frozen=True, slots=True)
class _View:
    """The file without the removed places; ``kept`` maps each list (by its path in the
    file) to the file's indices of the items left in it."""

    raw: Any
    kept: dict[Path, list[int]]


def salvaged(raw: dict[str, Any]) -> list[Problem]:
    """Cross-file problems (unplaced, paths as in the file) of what validates once the
    broken parts are removed; none when nothing useful is left."""
    removed: set[Path] = set()
    for _ in range(MAX_ROUNDS):
        view = _view(raw, removed, ())
        try:
            policy = PolicyFile.model_validate(view.raw)
        except ValidationError as exc:
            more = {_to_remove(error, view) for error in exc.errors(include_url=False)}
            if any(len(path) < 1 for path in more) or more <= removed:
                return []
            removed |= more
            continue
        if not removed:
            return []
        found = [_in_file(p, view.kept) for p in check(policy)]
        return [p for p in found if not _caused(p, removed, raw)]
    return []


def _to_remove(error: Any, view: _View) -> Path:
    """The place to take out for one error: the rule it is in, the mapping that misses a
    required key, or the key itself."""
    loc = tuple(error["loc"])
    place = schema.walk(loc)
    path = _in_file_path(place.union_at if place.union_at is not None else place.path, view.kept)
    if len(path) >= 2 and path[0] == "rules":
        return path[:2]
    if error["type"] == "missing":
        return path[:-1] if len(path) >= 2 else ()
    return path


def _view(value: Any, removed: set[Path], path: Path) -> _View:
    kept: dict[Path, list[int]] = {}
    return _View(_without(value, removed, path, kept), kept)


def _without(value: Any, removed: set[Path], path: Path, kept: dict[Path, list[int]]) -> Any:
    if isinstance(value, dict):
        return {
            k: _without(v, removed, (*path, k), kept)
            for k, v in value.items()
            if (*path, k) not in removed
        }
    if isinstance(value, list):
        indices = [i for i in range(len(value)) if (*path, i) not in removed]
        kept[path] = indices
        return [_without(value[i], removed, (*path, i), kept) for i in indices]
    return value


def _in_file_path(path: Path, kept: dict[Path, list[int]]) -> Path:
    """A path in the view -> the same place in the file (list indices renumbered)."""
    out: Path = ()
    for part in path:
        indices = kept.get(out)
        if isinstance(part, int) and indices is not None and 0 <= part < len(indices):
            part = indices[part]
        out = (*out, part)
    return out


def _in_file(problem: Problem, kept: dict[Path, list[int]]) -> Problem:
    return replace(problem, path=_in_file_path(problem.path, kept))


def _caused(problem: Problem, removed: set[Path], raw: dict[str, Any]) -> bool:
    """Whether removing ``removed`` could have caused ``problem``."""
    return any(_caused_by(problem, gone, raw) for gone in removed)


def _caused_by(problem: Problem, gone: Path, raw: dict[str, Any]) -> bool:
    path = problem.path
    if gone[0] == "rules":
        rules = raw.get("rules")
        last = isinstance(rules, list) and gone == ("rules", len(rules) - 1)
        return problem.code == "unused-flag" or (last and problem.code == "no-default")
    top = closest(str(gone[0]), schema.allowed_keys(PolicyFile)) or gone[0]
    whole = len(gone) == 1 or gone[0] != "pools"  # a ladder, or every pool
    if top in _LADDERS and whole and problem.code in _AFTER_LADDER:
        return True
    if len(gone) == 1:
        return path[:1] in (gone, (top,))
    if len(gone) == 2 and gone[0] in _NAMED:
        pool = gone[0] == "pools" and problem.code in _AFTER_POOL
        return pool or repr(str(gone[1])) in problem.message or path[:2] == gone
    return path[: len(gone) - 1] == gone[:-1]
