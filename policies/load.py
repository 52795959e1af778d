"""Read a policy file's text into a ``PolicyFile``, keeping the line and column of every value.

YAML is composed into nodes (PyYAML keeps their marks), turned into plain values while the
position of every key and value is recorded by path, and validated by the pydantic models.
pydantic's errors are rewritten into one problem per place, in words an operator knows
(``expected 'present', 'absent' or {names: [...]}``, ``unknown key 'temperatur'`` with a
"did you mean"). Pure: takes text or bytes, not a path.

Any input gives values or problems, never an exception, in bounded time and memory: bytes
that are not UTF-8, control characters and every other YAML error become problems; a file
over ``MAX_BYTES``, nesting deeper than ``MAX_DEPTH`` (checked on the parser's events before
anything recursive runs: libyaml's composer would overflow the C stack) and aliases that
expand to more than ``MAX_VALUES`` values (a "billion laughs" file) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from policies import schema
from policies.model import PolicyFile
from policies.problems import Path, PolicyError, Problem, closest, did_you_mean

try:  # the C loader is much faster; fall back where libyaml is missing
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]


MAX_BYTES = 512 * 1024
MAX_DEPTH = 64
MAX_VALUES = 50_000


class _TooMany(Exception):
    """More values than ``MAX_VALUES``: aliases expanding without bound."""


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
        return problem.at(*self.of(problem.path, key=key))

    def has(self, path: Path) -> bool:
        return path in self.values


@dataclass(frozen=True, slots=True)
class Loaded:
    policy: PolicyFile
    positions: Positions
    raw: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Read:
    """The file as plain values (None when it is not YAML), where each stands, and problems."""

    raw: Any
    positions: Positions
    problems: list[Problem]


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    """Turns composed YAML nodes into plain values, recording where each one stands."""

    def __init__(self) -> None:
        self.keys: dict[Path, tuple[int, int]] = {}
        self.values: dict[Path, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self._scalars = _Loader("")
        self._built = 0

    def close(self) -> None:
        self._scalars.dispose()

    def build(self, node: yaml.Node, path: Path) -> Any:
        self._built += 1
        if self._built > MAX_VALUES:
            raise _TooMany
        self.values[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _scalar(self, node: yaml.Node, path: Path) -> Any:
        """The node's value; one YAML cannot construct (an unknown tag, a date that does not
        exist, an integer of thousands of digits) is a problem, and None."""
        try:
            return self._scalars.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:
            problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else str(exc)
            message = f"cannot read this value: {problem}"
            self.problems.append(Problem(path, message, code="yaml").at(*_mark(node)))
            return None

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line, column = _mark(key_node)
            if not isinstance(key_node, yaml.ScalarNode):
                problem = Problem(path, "a key must be a plain word", code="bad-key")
                self.problems.append(problem.at(line, column))
                continue
            key = str(self._scalar(key_node, path))
            child = (*path, key)
            if key in out:
                first = self.keys[child]
                message = f"duplicate key {key!r} (first at line {first[0]})"
                problem = Problem(child, message, "keep one", code="duplicate-key")
                self.problems.append(problem.at(line, column))
            else:
                self.keys[child] = (line, column)
            out[key] = self.build(value_node, child)
        return out


def read(text: str | bytes) -> Read:
    """Compose the YAML and record positions; every fault of the input comes back as
    problems, never as an exception."""
    empty = Positions({}, {})
    decoded = decode(text)
    if isinstance(decoded, Problem):
        return Read(None, empty, [decoded])
    try:
        refused = _refused(decoded)
        node = refused or yaml.compose(decoded, Loader=_Loader)
    except yaml.YAMLError as exc:
        return Read(None, empty, [_yaml_problem(exc, decoded)])
    if isinstance(node, Problem):
        return Read(None, empty, [node])
    if node is None:
        return Read(None, empty, [Problem((), "the file is empty", code="empty").at(1, 1)])
    builder = _Builder()
    try:
        raw = builder.build(node, ())
    except _TooMany:
        message = f"the file expands to more than {MAX_VALUES} values (through aliases)"
        return Read(None, empty, [Problem((), message, code="too-large").at(1, 1)])
    finally:
        builder.close()
    positions = Positions(builder.keys, builder.values)
    problems = list(builder.problems)
    if not isinstance(raw, dict):
        message = "the file must be a mapping (version, pools, rules, ...)"
        problems.append(positions.place(Problem((), message, code="not-a-mapping")))
    return Read(raw, positions, problems)


def decode(data: str | bytes) -> str | Problem:
    """The file's text: UTF-8 (a byte order mark is dropped), at most ``MAX_BYTES``."""
    if len(data) > MAX_BYTES:
        message = f"the file is larger than {MAX_BYTES // 1024} KiB"
        return Problem((), message, code="too-large").at(1, 1)
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        message = f"not UTF-8 text: byte 0x{data[exc.start]:02x} is not part of a character"
        return Problem((), message, "save the file as UTF-8", code="encoding").at(line, column)


def _refused(text: str) -> Problem | None:
    """Nesting deeper than ``MAX_DEPTH`` or more than ``MAX_VALUES`` values, found on the
    parser's events (no recursion)."""
    depth = values = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            continue
        values += isinstance(event, yaml.NodeEvent)
        depth += isinstance(event, yaml.CollectionStartEvent)
        if depth > MAX_DEPTH or values > MAX_VALUES:
            message = (
                f"nested deeper than {MAX_DEPTH} levels"
                if depth > MAX_DEPTH
                else f"more than {MAX_VALUES} values"
            )
            mark = event.start_mark
            line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            return Problem((), message, code="too-large").at(line, column)
    return None


def _yaml_problem(exc: yaml.YAMLError, text: str) -> Problem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        return Problem((), f"not valid YAML: {exc.problem or exc}", code="yaml").at(line, column)
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character
        message = f"not valid YAML: character {char!r} is not allowed"
        return Problem((), message, code="yaml").at(line, column)
    return Problem((), f"not valid YAML: {exc}", code="yaml").at(1, 1)


def validate(raw: dict[str, Any], positions: Positions) -> tuple[PolicyFile | None, list[Problem]]:
    """The validated policy, or None and one placed problem per place that is wrong."""
    try:
        return PolicyFile.model_validate(raw), []
    except ValidationError as exc:
        return None, explain_errors(exc, raw, positions)


def parse(text: str | bytes, filename: str = "<policy>") -> Loaded:
    """Parse and validate one policy file; raise ``PolicyError`` listing every error."""
    got = read(text)
    policy, problems = (None, []) if got.problems else validate(got.raw, got.positions)
    errors = [p for p in [*got.problems, *problems] if p.is_error]
    if errors or policy is None:
        raise PolicyError(filename, errors)
    return Loaded(policy, got.positions, got.raw)


def explain_errors(
    exc: ValidationError, raw: Any, positions: Positions, root: Any = PolicyFile
) -> list[Problem]:
    """pydantic's errors as problems: union members collapsed, missing-vs-typo merged.
    ``root`` is the model validated (any file read with ``read``: a policy, a scenario)."""
    plain: list[tuple[Any, schema.Place]] = []
    unions: dict[Path, list[tuple[Any, schema.Place]]] = {}
    for error in exc.errors(include_url=False):
        place = schema.walk(tuple(error["loc"]), root)
        if place.union_at is None:
            plain.append((error, place))
        else:
            unions.setdefault(place.union_at, []).append((error, place))
    problems = [_problem(error, place, raw, positions, root) for error, place in plain]
    for at, members in unions.items():
        problems.extend(_union_problems(at, members, raw, positions, root))
    return _without_derived(_without_typo_twins(_unique(problems), exc, root), raw)


def _union_problems(
    at: Path, members: list[tuple[Any, schema.Place]], raw: Any, positions: Positions, root: Any
) -> list[Problem]:
    value = _value_at(raw, at)
    if isinstance(value, dict):
        inside = [(e, p) for e, p in members if schema.model_of(p.branch) is not None]
        if inside:
            return [_problem(error, place, raw, positions, root) for error, place in inside]
    expected = schema.walk(at, root).expected
    message = f"expected {schema.describe(expected)}, got {_shown(value)}"
    hint = _meant(value, schema.choices(expected))
    return [positions.place(Problem(at, message, hint, code="type"))]


def _problem(error: Any, place: schema.Place, raw: Any, positions: Positions, root: Any) -> Problem:
    kind: str = error["type"]
    path = place.path
    if kind == "extra_forbidden":
        key = str(path[-1])
        parent = schema.walk(tuple(error["loc"])[:-1], root).expected
        hint = did_you_mean(key, schema.allowed_keys(parent), "allowed keys")
        problem = Problem(path, f"unknown key {key!r}", hint, code="unknown-key")
        return positions.place(problem, key=True)
    if kind == "missing":
        parent = schema.walk(tuple(error["loc"])[:-1], root).expected
        hint = schema.description(parent, str(path[-1]))
        problem = Problem(path, f"missing required key {path[-1]!r}", hint, code="missing")
        return positions.place(problem)
    if kind == "value_error":
        return _value_error(error, path, raw, positions)
    message, hint, code = _words(kind, error, place)
    return positions.place(Problem(path, message, hint, code=code))


_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}
_KEY_HASH = "^sha256:[0-9a-f]{64}$"
_PATTERN_HINTS = {
    "^https?://": "an endpoint is a base URL such as http://vllm-spec:8000",
    "^[A-Za-z0-9_.:-]+$": "use letters, digits and _ . : -",
    _KEY_HASH: "give the key's hash, never the key: speclane policy hash-key",
}


def _words(kind: str, error: Any, place: schema.Place) -> tuple[str, str, str]:
    """Message, hint and code for one pydantic error that is not about keys."""
    ctx: dict[str, Any] = error.get("ctx") or {}
    got = _shown(error.get("input"))
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "")
        return f"must be {_BOUNDS[kind]} {bound}, got {got}", "", "bounds"
    if kind in ("too_short", "string_too_short"):
        return f"needs at least {ctx.get('min_length', 1)} item(s)", "", "bounds"
    if kind in ("too_long", "string_too_long"):
        return f"has more than {ctx.get('max_length')} item(s)", "", "bounds"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        if pattern == _KEY_HASH:  # maybe a key in the clear: never repeat it in a log
            got = "this value"
        return f"{got} does not match {pattern}", _PATTERN_HINTS.get(pattern, ""), "pattern"
    if place.expected is None:
        return str(error["msg"]), "", "type"
    message = f"expected {schema.describe(place.expected)}, got {got}"
    if kind in ("literal_error", "enum"):
        return message, _meant(error.get("input"), schema.choices(place.expected)), "type"
    return message, "", "type"


def _value_error(error: Any, path: Path, raw: Any, positions: Positions) -> Problem:
    """A model's own check: point at the key its message names, if the file has it."""
    message = str(error["msg"]).removeprefix("Value error, ")
    value = _value_at(raw, path)
    keys = [k for k in value if k in message] if isinstance(value, dict) else []
    at = (*path, keys[0]) if keys and positions.has((*path, keys[0])) else path
    return positions.place(Problem(at, message, code="value"))


def _without_typo_twins(problems: list[Problem], exc: ValidationError, root: Any) -> list[Problem]:
    """Drop "missing 'start'" when the same mapping has an unknown key meant as 'start'."""
    meant: set[Path] = set()
    for error in exc.errors(include_url=False):
        if error["type"] == "extra_forbidden":
            loc = tuple(error["loc"])
            parent = schema.walk(loc[:-1], root)
            key = closest(str(loc[-1]), schema.allowed_keys(parent.expected))
            meant.add((*parent.path, key or ""))
    return [p for p in problems if not (p.code == "missing" and p.path in meant)]


def _without_derived(problems: list[Problem], raw: Any) -> list[Problem]:
    """Drop "missing 'start'" in a rule with an experiment: its start is the first arm, and
    the arm's own problem is reported where it is."""

    def derived(p: Problem) -> bool:
        parent = _value_at(raw, p.path[:-1])
        in_rule = p.path[:1] == ("rules",) and len(p.path) == 3 and p.path[-1] == "start"
        return (
            in_rule and p.code == "missing" and isinstance(parent, dict) and "experiment" in parent
        )

    return [p for p in problems if not derived(p)]


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[Path, str]] = set()
    out = []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out


def _meant(value: Any, choices: list[str]) -> str:
    close = closest(value, choices) if isinstance(value, str) else None
    return f"did you mean {close!r}?" if close else ""


def _value_at(raw: Any, path: Path) -> Any:
    for part in path:
        in_list = isinstance(raw, list) and isinstance(part, int) and 0 <= part < len(raw)
        if not (in_list or (isinstance(raw, dict) and part in raw)):
            return None
        raw = raw[part]
    return raw


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
