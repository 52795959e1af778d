"""Structured-output and tool-call validity, table-driven over answers as they come."""

from __future__ import annotations

import pytest

from gateway.measure.validity import Collected, Schemas, expect

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMA = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
}
TOOLS = {
    "tools": [
        {"type": "function", "function": {"name": "weather", "parameters": PERSON}},
        {"type": "function", "function": {"name": "free"}},
    ]
}


def streamed(*deltas: dict, finish: str = "stop") -> Collected:
    out = Collected()
    for delta in deltas:
        out.delta({"index": 0, "delta": delta, "finish_reason": None})
    out.delta({"index": 0, "delta": {}, "finish_reason": finish})
    return out


@pytest.mark.parametrize(
    ("pieces", "finish", "result"),
    [
        (['{"name": "a",', ' "age": 3}'], "stop", "valid"),
        (['{"name": "a"}'], "stop", "schema_mismatch"),
        (['{"name": "a", "age": "x"}'], "stop", "schema_mismatch"),
        (['{"name": "a",', ' "age'], "length", "truncated"),
        (['{"name": "a",', ' "age'], "stop", "invalid_json"),
        (["not json at all"], "stop", "invalid_json"),
    ],
)
def test_json_schema_answers(pieces: list[str], finish: str, result: str) -> None:
    expectation = expect(SCHEMA)
    assert expectation is not None
    answer = streamed(*({"content": p} for p in pieces), finish=finish)
    assert Schemas().check(expectation, answer.choices()) == (("json_schema", result),)


def test_json_object_wants_an_object() -> None:
    expectation = expect({"response_format": {"type": "json_object"}})
    assert expectation is not None
    check = Schemas().check
    assert check(expectation, streamed({"content": '{"a": 1}'}).choices()) == (
        ("json_object", "valid"),
    )
    assert check(expectation, streamed({"content": "[1, 2]"}).choices()) == (
        ("json_object", "invalid_json"),
    )


def test_text_and_plain_requests_are_not_checked() -> None:
    assert expect({"messages": []}) is None
    assert expect({"response_format": {"type": "text"}}) is None
    assert expect({"tools": []}) is None


def test_tool_calls_from_a_stream() -> None:
    expectation = expect(TOOLS)
    assert expectation is not None
    first = {"index": 0, "id": "c1", "function": {"name": "weather", "arguments": '{"name": '}}
    answer = streamed(
        {"tool_calls": [first]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"x", "age": 1}'}}]},
        {"tool_calls": [{"index": 1, "function": {"name": "free", "arguments": "{}"}}]},
        {"tool_calls": [{"index": 2, "function": {"name": "nope", "arguments": "{}"}}]},
        {"tool_calls": [{"index": 3, "function": {"name": "weather", "arguments": "{}"}}]},
        finish="tool_calls",
    )
    assert Schemas().check(expectation, answer.choices()) == (
        ("tool_call", "valid"),
        ("tool_call", "valid"),
        ("tool_call", "unknown_tool"),
        ("tool_call", "schema_mismatch"),
    )


def test_a_whole_body_with_two_choices() -> None:
    expectation = expect(TOOLS | SCHEMA)
    assert expectation is not None
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"content": '{"name": "a", "age": 1}'},
                "finish_reason": "stop",
            },
            {
                "index": 1,
                "message": {
                    "content": None,
                    "tool_calls": [{"function": {"name": "weather", "arguments": "{"}}],
                },
                "finish_reason": "length",
            },
        ]
    }
    answer = Collected()
    answer.body(body)
    assert Schemas().check(expectation, answer.choices()) == (
        ("json_schema", "valid"),
        ("tool_call", "truncated"),
    )


def test_hostile_schemas_are_unchecked_never_fetched_or_slow() -> None:
    schemas = Schemas(max_entries=2)
    for schema in (
        {"$ref": "http://127.0.0.1:9/remote.json"},
        {"$ref": "file:///etc/passwd"},
        {"type": 5},
        {"type": "string", "pattern": "["},
    ):
        expectation = expect(
            {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
        )
        assert expectation is not None
        answer = streamed({"content": '"x"'})
        assert schemas.check(expectation, answer.choices()) == (("json_schema", "unchecked"),)
    # a catastrophic-backtracking pattern runs on a linear-time engine
    evil = {"type": "string", "pattern": "^(a+)+$"}
    expectation = expect(
        {"response_format": {"type": "json_schema", "json_schema": {"schema": evil}}}
    )
    assert expectation is not None
    answer = streamed({"content": '"' + "a" * 5000 + '!"'})
    assert schemas.check(expectation, answer.choices()) == (("json_schema", "schema_mismatch"),)
