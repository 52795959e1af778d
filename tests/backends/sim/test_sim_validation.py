"""The simulated server validates requests as vLLM 0.32 does: the same checks, in the same
order, with vLLM's messages, ``param`` and error shape; engine-time errors arrive inside a
stream that has started."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from backends.sim.config import SimConfig
from backends.sim.validation import Ask, SimHTTPError, parse
from tests.backends.sim.conftest import sse_events

Server = Callable[[SimConfig], contextlib.AbstractAsyncContextManager[str]]
MESSAGES = [{"role": "user", "content": "hello"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def ask(chat: bool = True, **fields: Any) -> Ask:
    body = ({"messages": MESSAGES} if chat else {"prompt": "hello"}) | fields
    return parse(
        orjson.dumps(body),
        chat=chat,
        names=("tiny",),
        default_max_tokens=64,
        max_model_len=2048,
        max_logprobs=20,
    )


def refused(chat: bool = True, **fields: Any) -> dict[str, Any]:
    with pytest.raises(SimHTTPError) as caught:
        ask(chat, **fields)
    error = orjson.loads(caught.value.body)["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert error["code"] == caught.value.status
    return error  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        (
            {"temperature": "hot"},
            "1 validation error:\n  {'type': 'float_parsing', 'loc': 'body.temperature', "
            "'msg': 'Input should be a valid number, unable to parse string as a number', "
            "'input': 'hot'}",
            "body.temperature",
        ),
        (
            {"max_tokens": "ten"},
            "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', "
            "'msg': 'Input should be a valid integer, unable to parse string as an integer', "
            "'input': 'ten'}",
            "body.max_tokens",
        ),
    ],
)
def test_type_errors_are_listed_like_vllm(fields: dict[str, Any], message: str, param: str) -> None:
    error = refused(**fields)
    assert (error["message"], error["param"], error["type"]) == (message, param, "Bad Request")


def test_a_union_field_lists_every_branch_under_one_clean_loc() -> None:
    error = refused(stop=5)
    assert error["message"].startswith("2 validation errors:\n  {'type': 'string_type'")
    assert error["message"].count("'loc': 'body.stop'") == 2 and error["param"] == "body.stop"


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        ({"temperature": 7}, "temperature must be in [0, 2], got 7.0.", "temperature"),
        ({"temperature": -1}, "temperature must be non-negative, got -1.0.", "temperature"),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0.", "top_p"),
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0.", "max_tokens"),
        (
            {"max_tokens": 4096},
            "max_tokens=4096 cannot be greater than max_model_len=2048. Please request fewer "
            "output tokens.",
            "max_tokens",
        ),
        ({"n": 0}, "n must be at least 1, got 0.", None),
        ({"stop": [""]}, "stop cannot contain an empty string.", None),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0.", None),
        (
            {"top_logprobs": 5},
            "when using `top_logprobs`, `logprobs` must be set to true.",
            "top_logprobs",
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            "response_format",
        ),
        (
            {"stream_options": {"include_usage": True}},
            "Stream options can only be defined when `stream=True`.",
            "stream_options",
        ),
        (
            {"stream": True, "prompt_logprobs": 2},
            "`prompt_logprobs` are not available when `stream=True`.",
            "prompt_logprobs",
        ),
        ({"tools": []}, "`tools` must not be an empty array. Either provide", "tools"),
        (
            {"tool_choice": "required"},
            "When using `tool_choice`, `tools` must be set.",
            "tool_choice",
        ),
    ],
)
def test_vllm_checks_name_their_parameter(
    fields: dict[str, Any], message: str, param: str | None
) -> None:
    error = refused(**fields)
    assert error["message"].startswith(message)
    assert error["type"] == "BadRequestError" and error["param"] == param
    if param is not None:
        assert f"(parameter={param}" in error["message"]


def test_lax_numbers_and_the_completions_endpoint() -> None:
    assert ask(temperature="0.5").max_tokens == 64
    assert ask(False).max_tokens == 16  # vLLM's completions default
    assert refused(False, prompt="")["param"] == "prompt"
    assert refused(False, logprobs="five")["param"] == "logprobs"
    long = refused(messages=[{"role": "user", "content": "word " * 3000}])
    assert long["param"] == "input_tokens" and "maximum context length is 2048" in long["message"]
    missing = refused(model="nope")
    assert (missing["code"], missing["type"], missing["param"]) == (404, "NotFoundError", "model")


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        (
            {"logprobs": True, "top_logprobs": 50},
            "Requested sample logprobs of 50, which is greater than max allowed: 20 "
            "(parameter=logprobs, value=50)",
            "logprobs",
        ),
        (
            {"prompt_logprobs": 25},
            "Requested prompt logprobs of 25, which is greater than max allowed: 20 "
            "(parameter=prompt_logprobs, value=25)",
            "prompt_logprobs",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "Grammar error: Invalid type: nonsense",
            None,
        ),
    ],
)
def test_engine_checks_are_deferred(
    fields: dict[str, Any], message: str, param: str | None
) -> None:
    deferred = ask(**fields).deferred
    assert deferred is not None and deferred.status == 400
    assert orjson.loads(deferred.event()) == {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    }
    assert ask(logprobs=True, top_logprobs=20).deferred is None


@pytest.mark.anyio
async def test_an_engine_error_is_the_first_event_of_a_started_stream(sim_server: Server) -> None:
    config = SimConfig(served_model_names=("tiny",), time_scale=0.01)
    body = {"model": "tiny", "messages": MESSAGES, "logprobs": True, "top_logprobs": 50}
    async with sim_server(config) as url, httpx.AsyncClient(base_url=url) as c:
        streamed = await c.post("/v1/chat/completions", json=body | {"stream": True})
        whole = await c.post("/v1/chat/completions", json=body)
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    first, done = sse_events(streamed.content)
    assert done == b"[DONE]"
    # vLLM writes it with json.dumps: Python's spacing, not compact JSON
    assert first.startswith(b'{"error": {"message": "Requested sample logprobs of 50')
    assert first.endswith(b'"type": "BadRequestError", "param": "logprobs", "code": 400}}')
    assert whole.status_code == 400
    assert whole.json() == orjson.loads(first)


NEVER_ENDS = {"$ref": "#/$defs/n", "$defs": {"n": {"$ref": "#/$defs/n"}}}


@pytest.mark.parametrize(
    ("schema", "fails"),
    [
        (NEVER_ENDS, True),
        ({"$ref": "#"}, True),
        ({"$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/b"},
                                                     "b": {"$ref": "#/definitions/a"}}}, True),
        ({"$ref": "#/$defs/n", "$defs": {"n": {"type": "string"}}}, False),
        ({"$ref": "#/$defs/missing"}, False),
        ({"type": "object", "properties": {"next": {"$ref": "#"}}}, False),  # a linked list
    ],
)  # fmt: skip
def test_a_ref_cycle_passes_validation_and_fails_in_the_engine_with_a_500(schema, fails):
    """vLLM 0.32 takes a schema that is a ``$ref`` cycle (xgrammar compiles it), then its
    engine kills the request at its first token: 500 ``InternalServerError``, whole or as
    the first event of a started stream, and the same on every endpoint."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    deferred = ask(response_format=fmt).deferred
    if not fails:
        assert deferred is None
        return
    assert deferred is not None and deferred.status == 500
    assert orjson.loads(deferred.event()) == {
        "error": {"message": "Internal server error", "type": "InternalServerError",
                  "param": None, "code": 500}
    }  # fmt: skip
