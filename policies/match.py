"""Rule matching: which rule's ``match`` a request satisfies first. Pure.

``matches`` is the reference: the meaning of a match, one rule at a time (``explain`` and
the property tests use it). ``covers`` says when one match certainly takes every request
another would (lint reports the later rule as unreachable).

``Matcher.first`` is the per-request fast path. It does not try rules one by one: at
compile time every constrained feature gets a table from feature value to the bitset of
rules that accept it (a dict for words, sorted breakpoints for ranges), so a request costs
one lookup per constrained feature, an AND, and the lowest set bit, almost the same for 10
rules as for 1,000.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Hashable, Sequence
from operator import attrgetter
from typing import Protocol

from policies.features import Features, ResponseFormat
from policies.model import Match, Range, ToolNames, ToolsMatch

RANGES = ("temperature", "top_p", "context_tokens", "max_tokens")
LISTS = ("endpoint", "model", "response_format", "tenant")


def _in(range_: Range | None, value: float | None) -> bool:
    if range_ is None:
        return True
    return value is not None and range_.contains(value)


def _tools(match: Match, features: Features) -> bool:
    wanted = match.tools
    if wanted is None:
        return True
    if isinstance(wanted, ToolNames):
        return any(name in features.tools for name in wanted.names)
    return features.has_tools == (wanted == "present")


def matches(match: Match, features: Features) -> bool:
    """True when every condition of ``match`` holds for ``features``."""
    return (
        (
            match.endpoint is None
            or features.endpoint in match.endpoint
            or features.api in match.endpoint
        )
        and (match.model is None or features.model in match.model)
        and (match.response_format is None or features.response_format in match.response_format)
        and (match.stream is None or features.stream == match.stream)
        and (match.tenant is None or features.tenant in match.tenant)
        and _in(match.temperature, features.temperature)
        and _in(match.top_p, features.top_p)
        and _in(match.context_tokens, features.prompt_tokens)
        and _in(match.max_tokens, features.max_tokens)
        and _tools(match, features)
        and (
            match.headers is None
            or all(features.headers.get(k.lower()) == v for k, v in match.headers.items())
        )
    )


def covers(a: Match, b: Match) -> bool:
    """True when every request ``b`` matches is certainly matched by ``a`` too."""
    return (
        all(_list_covers(getattr(a, n), getattr(b, n)) for n in ("endpoint", "model", "tenant"))
        and _formats_cover(a.response_format, b.response_format)
        and (a.stream is None or a.stream == b.stream)
        and all(_range_covers(getattr(a, n), getattr(b, n), n == "max_tokens") for n in RANGES)
        and _tools_cover(a.tools, b.tools)
        and _headers_cover(a.headers, b.headers)
    )


def _list_covers(a: list[str] | None, b: list[str] | None) -> bool:
    return a is None or (b is not None and set(b) <= set(a))


def _formats_cover(a: list[ResponseFormat] | None, b: list[ResponseFormat] | None) -> bool:
    return a is None or set(b if b is not None else ResponseFormat) <= set(a)


def _range_covers(a: Range | None, b: Range | None, optional: bool) -> bool:
    """``optional``: the feature may be missing, which only an absent range accepts."""
    if a is None:
        return True
    if b is None:
        return not optional and a.min is None and a.max is None
    low = a.min is None or (b.min is not None and b.min >= a.min)
    high = a.max is None or (b.max is not None and b.max <= a.max)
    return low and high


def _tools_cover(a: ToolsMatch | None, b: ToolsMatch | None) -> bool:
    if a is None:
        return True
    if isinstance(a, ToolNames):
        return isinstance(b, ToolNames) and set(b.names) <= set(a.names)
    if a == "present":
        return b == "present" or isinstance(b, ToolNames)
    return b == "absent"


def _headers_cover(a: dict[str, str] | None, b: dict[str, str] | None) -> bool:
    needed = {(k.lower(), v) for k, v in (a or {}).items()}
    return needed <= {(k.lower(), v) for k, v in (b or {}).items()}


def satisfiable(match: Match) -> bool:
    """False when ``match`` certainly matches nothing (an empty range or list, clashing headers)."""
    for name in RANGES:
        r: Range | None = getattr(match, name)
        if r is not None and r.min is not None and r.max is not None and r.min > r.max:
            return False
    if any(getattr(match, name) == [] for name in LISTS):
        return False
    wanted: dict[str, str] = {}
    for key, value in (match.headers or {}).items():
        if wanted.setdefault(key.lower(), value) != value:
            return False
    return True


class _Dimension(Protocol):
    def mask(self, features: Features) -> int: ...


class _Choice:
    """A feature compared with lists of values: value -> rules accepting it."""

    __slots__ = ("_default", "_get", "_table")

    def __init__(self, get: Callable[[Features], Hashable], table: dict[Hashable, int], free: int):
        self._get = get
        self._table = {value: bits | free for value, bits in table.items()}
        self._default = free

    def mask(self, features: Features) -> int:
        return self._table.get(self._get(features), self._default)


class _Door(_Choice):
    """The endpoint: a rule's list may name the path (or header value) or the API."""

    __slots__ = ()

    def mask(self, features: Features) -> int:
        table, free = self._table, self._default
        return table.get(features.endpoint, free) | table.get(features.api, free)


class _Span:
    """A numeric feature compared with inclusive ranges: breakpoints -> rules accepting it."""

    __slots__ = ("_at", "_between", "_get", "_missing", "_nan", "_points")

    def __init__(self, get: Callable[[Features], float | None], ranges: Sequence[Range | None]):
        self._get = get
        points = sorted({b for r in ranges if r for b in (r.min, r.max) if b is not None})
        self._points = points
        self._at = [_bits(ranges, point) for point in points]
        edges = [-math.inf, *points, math.inf]
        inside = [math.nextafter(lo, hi) for lo, hi in zip(edges, edges[1:], strict=False)]
        self._between = [_bits(ranges, value) for value in inside]
        self._missing = _bits(ranges, None)
        self._nan = _bits(ranges, math.nan)

    def mask(self, features: Features) -> int:
        value = self._get(features)
        if value is None:
            return self._missing
        i = bisect_left(self._points, value)
        if i < len(self._points) and self._points[i] == value:
            return self._at[i]
        return self._nan if value != value else self._between[i]


def _bits(ranges: Sequence[Range | None], value: float | None) -> int:
    return sum(1 << i for i, r in enumerate(ranges) if _in(r, value))


class _Tools:
    __slots__ = ("_absent", "_names", "_present")

    def __init__(self, matches_: Sequence[Match]) -> None:
        free = _bits_where(matches_, lambda m: m.tools is None)
        self._absent = free | _bits_where(matches_, lambda m: m.tools == "absent")
        self._present = free | _bits_where(matches_, lambda m: m.tools == "present")
        self._names: dict[str, int] = {}
        for i, match in enumerate(matches_):
            if isinstance(match.tools, ToolNames):
                for name in match.tools.names:
                    self._names[name] = self._names.get(name, 0) | 1 << i

    def mask(self, features: Features) -> int:
        if not features.tools:
            return self._absent
        bits = self._present
        for name in features.tools:
            bits |= self._names.get(name, 0)
        return bits


class _Header:
    """One header name: its value -> rules whose conditions on that name it satisfies."""

    __slots__ = ("_default", "_name", "_table")

    def __init__(self, name: str, matches_: Sequence[Match]) -> None:
        self._name = name
        self._default = 0
        table: dict[str, int] = {}
        for i, match in enumerate(matches_):
            wanted = {v for k, v in (match.headers or {}).items() if k.lower() == name}
            if not wanted:
                self._default |= 1 << i
            elif len(wanted) == 1:
                value = wanted.pop()
                table[value] = table.get(value, 0) | 1 << i
        self._table = {value: bits | self._default for value, bits in table.items()}

    def mask(self, features: Features) -> int:
        value = features.headers.get(self._name)
        return self._default if value is None else self._table.get(value, self._default)


def _bits_where(matches_: Sequence[Match], test: Callable[[Match], bool]) -> int:
    return sum(1 << i for i, match in enumerate(matches_) if test(match))


def _choice(matches_: Sequence[Match], field: str, kind: type[_Choice] = _Choice) -> _Choice | None:
    lists = [getattr(match, field) for match in matches_]
    if all(values is None for values in lists):
        return None
    table: dict[Hashable, int] = {}
    free = 0
    for i, values in enumerate(lists):
        if values is None:
            free |= 1 << i
            continue
        for value in values if isinstance(values, list) else [values]:
            table[value] = table.get(value, 0) | 1 << i
    return kind(attrgetter(field), table, free)


_RANGES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "context_tokens": "prompt_tokens",
    "max_tokens": "max_tokens",
}


def _dimensions(matches_: Sequence[Match]) -> list[_Dimension]:
    words = ("model", "endpoint", "response_format", "stream", "tenant")
    found: list[_Dimension | None] = [
        _choice(matches_, field, _Door if field == "endpoint" else _Choice) for field in words
    ]

    for field, feature in _RANGES.items():
        ranges: list[Range | None] = [getattr(match, field) for match in matches_]
        if any(r is not None for r in ranges):
            found.append(_Span(attrgetter(feature), ranges))
    if any(match.tools is not None for match in matches_):
        found.append(_Tools(matches_))
    names = {k.lower() for match in matches_ for k in (match.headers or {})}
    found.extend(_Header(name, matches_) for name in sorted(names))
    return [dimension for dimension in found if dimension is not None]


class Matcher:
    """Finds the first matching rule; when none matches, the last (which compiles as a default)."""

    __slots__ = ("_all", "_dimensions", "_matches")

    def __init__(self, matches_: Sequence[Match]) -> None:
        self._matches = tuple(matches_)
        self._all = (1 << len(self._matches)) - 1
        self._dimensions = tuple(_dimensions(self._matches))

    def first(self, features: Features) -> int:
        bits = self._all
        for dimension in self._dimensions:
            bits &= dimension.mask(features)
            if not bits:
                return len(self._matches) - 1
        return (bits & -bits).bit_length() - 1

    def first_linear(self, features: Features) -> int:
        """The reference: try each rule in order (for tests and benchmarks)."""
        for i, match in enumerate(self._matches):
            if matches(match, features):
                return i
        return len(self._matches) - 1
