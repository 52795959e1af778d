"""Cross-file checks: which earlier match certainly takes every request of a later one."""

from __future__ import annotations

from typing import Any

import pytest

from policies.match import covers
from policies.model import Match


def m(**conditions: Any) -> Match:
    return Match.model_validate(conditions)


COVERS = [
    # (earlier, later, earlier covers later)
    (m(), m(temperature={"max": 0.3}), True),
    (m(temperature={"max": 0.3}), m(), False),
    (m(temperature={"max": 0.5}), m(temperature={"max": 0.3}), True),
    (m(temperature={"max": 0.3}), m(temperature={"max": 0.5}), False),
    (m(temperature={"min": 0.1, "max": 0.5}), m(temperature={"min": 0.2, "max": 0.3}), True),
    (m(temperature={"min": 0.2}), m(temperature={"max": 0.3}), False),
    (m(temperature={}), m(), True),  # a range with no ends takes every temperature
    (m(max_tokens={}), m(), False),  # ... but not a request without max_tokens
    (m(context_tokens={"min": 16000}), m(context_tokens={"min": 20000}), True),
    (m(response_format=["json_object", "json_schema"]), m(response_format=["json_schema"]), True),
    (m(response_format=["json_schema"]), m(response_format=["json_object"]), False),
    (m(response_format=["text", "json_object", "json_schema"]), m(), True),
    (m(model=["a", "b"]), m(model=["a"]), True),
    (m(model=["a"]), m(), False),
    (m(tenant=["x"]), m(tenant=["x", "y"]), False),
    (m(tools="present"), m(tools={"names": ["get_weather"]}), True),
    (m(tools="present"), m(tools="absent"), False),
    (m(tools="absent"), m(tools="absent"), True),
    (m(tools={"names": ["a", "b"]}), m(tools={"names": ["a"]}), True),
    (m(tools={"names": ["a"]}), m(tools={"names": ["a", "b"]}), False),
    (m(tools={"names": ["a"]}), m(tools="present"), False),
    (m(stream=True), m(stream=True, tenant=["x"]), True),
    (m(stream=True), m(), False),
    (m(headers={"X-Team": "a"}), m(headers={"x-team": "a", "x-env": "prod"}), True),
    (m(headers={"x-team": "a"}), m(headers={"x-team": "b"}), False),
    (m(headers={}), m(), True),
    (
        m(response_format=["json_schema"], temperature={"max": 0.3}),
        m(response_format=["json_schema"], temperature={"max": 0.2}, tools="present"),
        True,
    ),
]


@pytest.mark.parametrize(("earlier", "later", "expected"), COVERS)
def test_covers(earlier: Match, later: Match, expected: bool) -> None:
    assert covers(earlier, later) is expected


def test_every_match_covers_itself() -> None:
    for earlier, later, _ in COVERS:
        assert covers(earlier, earlier)
        assert covers(later, later)
