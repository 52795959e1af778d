from __future__ import annotations

import json
import random

import pytest

from backends.sim.model import RequestProfile
from backends.sim.text import TextBank, json_tokens, schema_tokens
from backends.sim.workload import Workload


def profile(workload: Workload, n: int, *, tool: str | None = None) -> RequestProfile:
    return RequestProfile(
        workload=workload,
        prompt_tokens=5,
        max_tokens=n,
        output_tokens=n,
        finish_reason="stop",
        acceptance=0.5,
        seed_key=f"text:{workload}:{n}",
        tool_name=tool,
    )


@pytest.mark.parametrize("n", [2, 3, 4, 5, 10, 57, 300])
def test_json_tokens_are_exactly_n_and_valid(n: int) -> None:
    for seed in range(10):
        tokens = json_tokens(random.Random(seed), n, ("a", "b"))
        assert len(tokens) == n
        assert isinstance(json.loads("".join(tokens)), dict)


@pytest.mark.parametrize("workload", list(Workload))
@pytest.mark.parametrize("n", [1, 7, 200, 9000])
def test_bank_gives_exactly_n_tokens(workload: Workload, n: int) -> None:
    tokens = TextBank(0).tokens(profile(workload, n), {})
    assert len(tokens) == n and all(isinstance(t, str) and t for t in tokens)


def test_bank_is_deterministic_and_workload_shaped() -> None:
    bank = TextBank(1)
    code = "".join(bank.tokens(profile(Workload.CODE, 80), {}))
    assert code == "".join(TextBank(1).tokens(profile(Workload.CODE, 80), {}))
    assert any(word in code for word in ("def", "return", "class", "import"))
    assert json.loads("".join(bank.tokens(profile(Workload.JSON, 50), {})))


def test_tool_arguments_use_the_schema_and_skip_the_name_token() -> None:
    p = profile(Workload.TOOLS, 30, tool="get_weather")
    tokens = TextBank(0).tokens(p, {"city": {}, "unit": {}})
    assert len(tokens) == 29
    assert set(json.loads("".join(tokens))) <= {"city", "unit", "city_1", "unit_1", "city_2"}
    assert TextBank(0).tokens(profile(Workload.TOOLS, 1, tool="f"), {}) == []


@pytest.mark.parametrize("n", [2, 5, 9, 40, 160])
def test_schema_tokens_follow_the_schema(n: int) -> None:
    properties = {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["a", "b"]},
        "note": {"type": ["string", "null"]},
    }
    for seed in range(20):
        tokens = schema_tokens(random.Random(seed), n, properties)
        assert len(tokens) == n
        value = json.loads("".join(tokens))
        assert list(value) == list(properties)[: len(value)]
        if n >= 40:
            assert set(value) == set(properties)
            assert isinstance(value["age"], int) and isinstance(value["ok"], bool)
            assert value["kind"] == "a" and isinstance(value["note"], str)
