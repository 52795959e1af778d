"""Classification, table-driven: request + headers -> Features."""

from __future__ import annotations

import orjson
import pytest

from gateway import tokens
from gateway.classify import Defaults, classify
from gateway.schema import parse
from policies.features import ResponseFormat

DEFAULTS = Defaults(temperature=1.0, top_p=1.0)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def features(body: dict, headers: dict | None = None, kind="chat", path="/v1/chat/completions"):
    request, _ = parse(orjson.dumps(body), kind)
    return classify(request, path, headers or {}, "req-1", DEFAULTS)


def chat(**extra):
    return {"model": "m", "messages": [{"role": "user", "content": "hello there"}], **extra}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chat(), {"temperature": 1.0, "top_p": 1.0, "tools": (), "stream": False}),
        (chat(temperature=0, top_p=0.5), {"temperature": 0.0, "top_p": 0.5}),
        (chat(max_tokens=10), {"max_tokens": 10}),
        (chat(max_tokens=10, max_completion_tokens=20), {"max_tokens": 20}),
        (chat(stream=True, n=2), {"stream": True, "n": 2}),
        (chat(tools=[TOOL]), {"tools": ("get_weather",)}),
        (chat(response_format={"type": "json_object"}), {"response_format": "json_object"}),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "person"}}),
            {"response_format": ResponseFormat.JSON_SCHEMA, "schema_name": "person"},
        ),
        (chat(response_format={"type": "structural_tag"}), {"response_format": "text"}),
        (chat(user="u-7"), {"routing_key": "u-7"}),
        (chat(), {"routing_key": "req-1", "tenant": "", "endpoint": "/v1/chat/completions"}),
    ],
)
def test_chat_features(body, expected):
    got = features(body)
    for name, value in expected.items():
        assert getattr(got, name) == value, name


def test_tenant_from_header_or_api_key_hash_never_the_key():
    by_header = features(chat(), {"x-speclane-tenant": "acme", "authorization": "Bearer sk-1"})
    by_key = features(chat(), {"authorization": "Bearer sk-1"})
    other_key = features(chat(), {"authorization": "Bearer sk-2"})
    assert by_header.tenant == "acme" and by_header.routing_key == "acme"
    assert by_key.tenant.startswith("key-") and "sk-1" not in by_key.tenant
    assert by_key.tenant != other_key.tenant


def test_tool_definitions_count_as_prompt_tokens():
    plain = features(chat()).prompt_tokens
    with_tools = features(chat(tools=[TOOL] * 5)).prompt_tokens
    assert with_tools > plain + 20


def test_endpoint_header_names_a_product_endpoint():
    got = features(chat(), {"x-speclane-endpoint": "code-assist"})
    assert got.endpoint == "code-assist"


def test_tool_fingerprint_is_stable_and_sensitive_to_schemas():
    tool_b = {**TOOL, "function": {**TOOL["function"], "parameters": {"type": "string"}}}
    one = features(chat(tools=[TOOL])).tools_fingerprint
    again = features(chat(tools=[{"function": TOOL["function"], "type": "function"}]))
    assert one and one == again.tools_fingerprint
    assert one != features(chat(tools=[tool_b])).tools_fingerprint


@pytest.mark.parametrize(
    "content",
    [
        "x" * 3800,
        [{"type": "text", "text": "x" * 3800}, {"type": "image_url", "image_url": {}}],
    ],
)
def test_prompt_tokens_count_the_text_of_every_message(content):
    got = features({"model": "m", "messages": [{"role": "user", "content": content}]})
    assert got.prompt_tokens == tokens.estimate(["x" * 3800], messages=1)


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [([1, 2, 3, 4], 4), ([[1, 2], [1, 2, 3, 4, 5]], 5)],
)
def test_completions_token_prompts_count_exactly(prompt, tokens):
    got = features({"model": "m", "prompt": prompt}, kind="completion", path="/v1/completions")
    assert got.prompt_tokens == tokens and got.endpoint == "/v1/completions"


def test_completions_text_prompts():
    one = features({"model": "m", "prompt": "abcd" * 100}, kind="completion")
    many = features({"model": "m", "prompt": ["abcd" * 100, "ab"]}, kind="completion")
    assert one.prompt_tokens == tokens.estimate(["abcd" * 100])
    assert many.prompt_tokens == tokens.estimate(["abcd" * 100, "ab"])
