"""Classification of Anthropic's Messages and OpenAI's Responses requests: the same tool
schema is the same slice through any door, the context counts the system prompt wherever
the API puts it, and the rest reads as chat's does."""

from __future__ import annotations

import orjson
import pytest

from gateway.apis import named
from gateway.classify import Defaults, classify
from gateway.errors import ApiError
from gateway.schema import parse
from policies.features import Features, ResponseFormat
from policies.slices import Slicer

DEFAULTS = Defaults(temperature=1.0, top_p=1.0)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
PATHS = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}


def features(body: dict, kind: str) -> Features:
    request, _ = parse(orjson.dumps(body), named(kind).model)
    return classify(request, PATHS[kind], {}, "req-1", DEFAULTS)


def by_chat(**extra) -> dict:
    tool = {"name": "get_weather", "description": "weather", "parameters": SCHEMA}
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You answer with tools."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [{"type": "function", "function": tool}],
        **extra,
    }


def by_messages(**extra) -> dict:
    tool = {"name": "get_weather", "description": "weather", "input_schema": SCHEMA}
    return {
        "model": "m",
        "max_tokens": 100,
        "system": "You answer with tools.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
        "tools": [tool],
        **extra,
    }


def by_responses(**extra) -> dict:
    tool = {"type": "function", "name": "get_weather", "description": "weather"}
    return {
        "model": "m",
        "instructions": "You answer with tools.",
        "input": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [tool | {"parameters": SCHEMA}],
        **extra,
    }


def test_one_tool_schema_is_one_slice_through_every_door():
    chat = features(by_chat(), "chat")
    messages = features(by_messages(), "messages")
    responses = features(by_responses(), "responses")
    assert chat.tools == messages.tools == responses.tools == ("get_weather",)
    assert chat.tools_fingerprint == messages.tools_fingerprint == responses.tools_fingerprint
    assert chat.prompt_tokens == messages.prompt_tokens == responses.prompt_tokens
    slicer = Slicer.of([0.3], [4000], tool_schemas=16)
    keys = {slicer.key("tools", f) for f in (chat, messages, responses)}
    assert len(keys) == 1
    assert (chat.api, messages.api, responses.api) == ("chat", "messages", "responses")
    other = by_messages(tools=[{"name": "get_weather", "input_schema": {"type": "object"}}])
    assert features(other, "messages").tools_fingerprint != messages.tools_fingerprint


@pytest.mark.parametrize(
    ("body", "kind", "expected"),
    [
        (by_messages(), "messages", {"temperature": 1.0, "max_tokens": 100, "stream": False}),
        (by_messages(temperature=0.2, stream=True), "messages", {"temperature": 0.2}),
        (
            by_messages(thinking={"type": "enabled", "budget_tokens": 64}),
            "messages",
            {"thinking": True},
        ),
        (by_messages(metadata={"user_id": "u1"}), "messages", {"user": "u1", "routing_key": ""}),
        (by_responses(), "responses", {"temperature": 1.0, "max_tokens": None}),
        (by_responses(max_output_tokens=50, temperature=0), "responses", {"max_tokens": 50}),
        (by_responses(reasoning={"effort": "low"}), "responses", {"thinking": True}),
        (
            by_responses(text={"format": {"type": "json_schema", "name": "person", "schema": {}}}),
            "responses",
            {"response_format": ResponseFormat.JSON_SCHEMA, "schema_name": "person"},
        ),
        (
            {"model": "m", "input": "hello", "tools": [{"type": "web_search"}]},
            "responses",
            {"tools": ("web_search",)},
        ),
    ],
)
def test_fields(body, kind, expected):
    found = features(body, kind)
    for name, value in expected.items():
        assert getattr(found, name) == value, name


def test_a_longer_conversation_is_a_longer_context():
    short = features(by_messages(), "messages").prompt_tokens
    turns = by_messages()["messages"] + [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny " * 50}],
        },
    ]
    assert features(by_messages(messages=turns), "messages").prompt_tokens > short + 50


@pytest.mark.parametrize(
    ("body", "kind", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "messages", "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages", "messages"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "t"}],
            },
            "messages",
            "tools.0.input_schema",
        ),
        ({"model": "m"}, "responses", "input"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "responses", "max_output_tokens"),
    ],
)
def test_bad_input_names_the_field(body, kind, param):
    with pytest.raises(ApiError) as refused:
        parse(orjson.dumps(body), named(kind).model)
    assert refused.value.status == 400 and refused.value.param == param
