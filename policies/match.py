"""Rule matching: which rule's ``match`` a request satisfies first. Pure.

``explain`` gives, for one rule, whether it matches and why; ``Matcher.first`` is the fast
path used per request.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.features import Features
from policies.model import Match, Range, ToolNames


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
        (match.endpoint is None or features.endpoint in match.endpoint)
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


class Matcher:
    """Finds the first matching rule. The last rule must match everything."""

    __slots__ = ("_matches",)

    def __init__(self, matches_: Sequence[Match]) -> None:
        self._matches = tuple(matches_)

    def first(self, features: Features) -> int:
        for i, match in enumerate(self._matches):
            if matches(match, features):
                return i
        return len(self._matches) - 1
