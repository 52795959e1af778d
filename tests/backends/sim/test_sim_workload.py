from __future__ import annotations

import pytest

from backends.sim.workload import (
    Workload,
    classify,
    estimate_prompt_tokens,
    forced_tool_name,
    prompt_text,
    temperature_of,
    tool_parameters,
)

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chat("give me a record", response_format={"type": "json_object"}), Workload.JSON),
        (chat("x", response_format={"type": "json_schema", "json_schema": {}}), Workload.JSON),
        (
            chat("write python", response_format={"type": "json_object"}, tools=[TOOL]),
            Workload.JSON,
        ),
        (chat("weather in Paris?", tools=[TOOL]), Workload.TOOLS),
        (chat("write code please", tools=[TOOL]), Workload.TOOLS),
        (chat("```\nprint(1)\n```", temperature=0), Workload.CODE),
        (chat("def add(a, b):", temperature=0), Workload.CODE),
        (chat("fix this function", temperature=1.0), Workload.CODE),
        (chat("import numpy as np"), Workload.CODE),
        (chat("class Foo: pass"), Workload.CODE),
        (chat("please summarise this", temperature=0.2), Workload.SUMMARISE),
        (chat("Summarize the meeting", temperature=1.0), Workload.SUMMARISE),
        (chat("word " * 8000, temperature=0.2), Workload.SUMMARISE),
        (chat("write a poem", temperature=0.9), Workload.CREATIVE),
        (chat("write a poem"), Workload.CREATIVE),
        (chat("hello there", temperature=0.7), Workload.CHAT),
        (chat("hello", response_format={"type": "text"}, temperature=0), Workload.CHAT),
        ({"prompt": "def f(x):", "temperature": 0}, Workload.CODE),
        ({"prompt": "Once upon a time", "temperature": 0.3}, Workload.CHAT),
        ({"prompt": [1, 2, 3], "temperature": 0.3}, Workload.CHAT),
    ],
)
def test_classification_table(body: dict[str, object], expected: Workload) -> None:
    assert classify(body) is expected


def test_long_context_threshold_is_a_setting() -> None:
    body = chat("word " * 400, temperature=0.2)
    assert classify(body) is Workload.CHAT
    assert classify(body, long_context_tokens=400) is Workload.SUMMARISE


def test_prompt_text_reads_parts_and_prompts() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
            {"role": "user", "content": "b"},
            "junk",
        ]
    }
    assert prompt_text(body) == "a\nb"
    assert prompt_text({"prompt": ["x", "y", 3]}) == "x\ny"
    assert prompt_text({}) == ""


def test_estimate_prompt_tokens() -> None:
    assert estimate_prompt_tokens(chat("x" * 400)) == 104
    assert estimate_prompt_tokens({"prompt": [5, 6, 7, 8]}) == 4
    assert estimate_prompt_tokens({"prompt": ""}) == 1


def test_temperature_default_and_malformed() -> None:
    assert temperature_of({}) == 1.0
    assert temperature_of({"temperature": True}) == 1.0
    assert temperature_of({"temperature": 0}) == 0.0


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, None),
        ({"tools": [TOOL]}, None),
        ({"tools": [TOOL], "tool_choice": "auto"}, None),
        ({"tools": [TOOL], "tool_choice": "required"}, "get_weather"),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tool"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}}, "x"),
        ({"tools": [TOOL], "tool_choice": {"type": "function"}}, None),
        ({"tool_choice": "required"}, None),
    ],
)
def test_forced_tool_name(extra: dict[str, object], expected: str | None) -> None:
    assert forced_tool_name(chat("hi", **extra)) == expected


def test_tool_parameters() -> None:
    body = chat("hi", tools=[{"type": "function"}, TOOL])
    assert list(tool_parameters(body, "get_weather")) == ["city"]
    assert tool_parameters(body, "other") == {}
