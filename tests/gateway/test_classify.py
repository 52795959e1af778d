"""Classification, table-driven: request + headers -> Features."""

from __future__ import annotations

import orjson
import pytest

from gateway import tokens
from gateway.apis import named
from gateway.classify import Defaults, classify
from gateway.identity import caller_from, key_hash
from gateway.schema import ChatRequest, parse
from policies.features import ResponseFormat

DEFAULTS = Defaults(temperature=1.0, top_p=1.0)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def features(body: dict, headers: dict | None = None, kind="chat", path="/v1/chat/completions"):
    request, _ = parse(orjson.dumps(body), named(kind).model)
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
        (chat(user="u-7"), {"routing_key": "", "user": "u-7"}),
        (
            chat(),
            {"routing_key": "", "tenant": "anonymous", "endpoint": "/v1/chat/completions"},
        ),
    ],
)
def test_chat_features(body, expected):
    got = features(body)
    for name, value in expected.items():
        assert getattr(got, name) == value, name


KEYS = {key_hash("sk-acme"): "acme", key_hash("sk-beta"): "beta"}


@pytest.mark.parametrize(
    ("headers", "trusted", "tenant", "sticky"),
    [
        ({"authorization": "Bearer sk-acme"}, None, "acme", "acme"),
        ({"authorization": "bearer sk-beta"}, None, "beta", "beta"),
        ({"authorization": "Bearer sk-acme", "x-speclane-tenant": "beta"}, None, "acme", "acme"),
        ({"x-speclane-tenant": "acme"}, None, "anonymous", ""),
        ({"x-tenant": "beta", "authorization": "Bearer sk-acme"}, "x-tenant", "beta", "beta"),
        ({"x-tenant": "no spaces", "authorization": "Bearer sk-acme"}, "x-tenant", "acme", "acme"),
        ({}, None, "anonymous", ""),
        ({"authorization": "Basic c2stYWNtZQ=="}, None, "anonymous", ""),
    ],
)
def test_the_tenant_comes_from_a_known_key_or_a_trusted_header(headers, trusted, tenant, sticky):
    caller = caller_from(headers, trusted, KEYS)
    assert (caller.tenant, caller.sticky) == (tenant, sticky)


def test_an_unknown_key_is_anonymous_and_names_no_rollout_arm():
    one = caller_from({"authorization": "Bearer sk-1"}, None, KEYS)
    other = caller_from({"authorization": "Bearer sk-2"}, None, KEYS)
    assert one == other == caller_from({}, None, KEYS)
    assert one.tenant == "anonymous" and one.sticky == ""


def test_a_user_cannot_pick_a_tenant_or_a_rollout_arm():
    acme = caller_from({"authorization": "Bearer sk-acme"}, None, KEYS)
    beta = caller_from({"authorization": "Bearer sk-beta"}, None, KEYS)
    for user in ["acme", "beta", "anonymous", "acme/x", None]:
        request, _ = parse(orjson.dumps(chat(user=user)), ChatRequest)
        in_acme = classify(request, "/v1/chat/completions", {}, "r", DEFAULTS, acme)
        in_beta = classify(request, "/v1/chat/completions", {}, "r", DEFAULTS, beta)
        assert (in_acme.tenant, in_acme.routing_key) == ("acme", "acme")
        assert (in_beta.tenant, in_beta.routing_key) == ("beta", "beta")
        assert in_acme.user == in_beta.user == (user or "")


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
    got = features({"model": "m", "prompt": prompt}, kind="completions", path="/v1/completions")
    assert got.prompt_tokens == tokens and got.endpoint == "/v1/completions"


def test_completions_text_prompts():
    one = features({"model": "m", "prompt": "abcd" * 100}, kind="completions")
    many = features({"model": "m", "prompt": ["abcd" * 100, "ab"]}, kind="completions")
    assert one.prompt_tokens == tokens.estimate(["abcd" * 100])
    assert many.prompt_tokens == tokens.estimate(["abcd" * 100, "ab"])


def test_left_out_sampling_fields_are_the_policys_defaults_and_marked() -> None:
    from policies.model import RequestDefaults

    defaults = DEFAULTS.under(RequestDefaults(temperature=0.6))
    request, _ = parse(orjson.dumps(chat()), ChatRequest)
    left_out = classify(request, "/v1/chat/completions", {}, "r", defaults)
    assert (left_out.temperature, left_out.top_p) == (0.6, 1.0)
    assert left_out.defaulted == ("temperature", "top_p")
    request, _ = parse(orjson.dumps(chat(temperature=1.2)), ChatRequest)
    given = classify(request, "/v1/chat/completions", {}, "r", defaults)
    assert (given.temperature, given.defaulted) == (1.2, ("top_p",))
    assert DEFAULTS.under(RequestDefaults()) is DEFAULTS
