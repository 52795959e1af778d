"""The error tree: typed failures become the client's errors in one place, and the module
docstring names every code the gateway answers with."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest

import gateway.errors
from backends.errors import (
    ANTHROPIC_TYPES,
    StreamBroken,
    Unavailable,
    UpstreamTimeout,
    anthropic_type,
)
from gateway.errors import ApiError, UpstreamErrorEvent, anthropic_rejected, broke, from_backend
from gateway.measure.messages import failure

ROOT = Path(__file__).parent.parent.parent


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (UpstreamTimeout("slow"), 504, "upstream_timeout"),
        (Unavailable("down"), 503, "no_healthy_upstream"),
        (StreamBroken("cut"), 502, "upstream_stream_broken"),
        (UpstreamErrorEvent(b"{}", "upstream error: boom", 500), 502, "upstream_error"),
    ],
)
def test_typed_failures_map_to_one_client_error_each(failure, status, code):
    error = from_backend(failure)
    assert (error.status, error.code, error.type) == (status, code, "server_error")
    assert error.message == str(failure)


def test_no_healthy_upstream_says_when_to_come_back():
    failure = Unavailable("down")
    assert from_backend(failure).retry_after_s == 1.0
    failure.retry_after_s = 7.0
    assert from_backend(failure).response().headers["retry-after"] == "7"


def test_a_broken_answer_says_how_often_it_broke():
    error = broke(3)
    assert (error.status, error.code) == (502, "upstream_stream_broken")
    assert "3 times" in error.message


def test_api_errors_are_built_by_keyword_only():
    with pytest.raises(TypeError):
        ApiError(400, "positional")  # type: ignore[misc]


_CODE_AT = {"_server_error": 2, "_refuse": 3}  # where the helpers take their code


def _codes_raised() -> set[str]:
    """Every ``code="..."`` literal, and every error code handed to a helper, in gateway/."""
    codes = set()
    for path in (ROOT / "gateway").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or _called(node) == "Problem":
                continue  # a lint finding's code names its kind, not an answer's
            for keyword in node.keywords:
                if keyword.arg == "code" and isinstance(keyword.value, ast.Constant):
                    codes.add(keyword.value.value)
            at = _CODE_AT.get(_called(node))
            if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant):
                codes.add(node.args[at].value)
    return codes - {None}


def _called(node: ast.Call) -> str:
    return str(getattr(node.func, "id", getattr(node.func, "attr", "")))


def test_the_docstring_draws_every_code_the_gateway_answers_with():
    tree = gateway.errors.__doc__ or ""
    codes = _codes_raised() | {gateway.errors.BROKEN}
    assert {"model_not_found", "too_many_requests", "upstream_error"} <= codes
    missing = sorted(c for c in codes if c not in tree)
    assert not missing, f"gateway/errors.py's docstring lacks {missing}"


def test_a_failed_stream_ends_with_its_apis_own_error_event():
    """Anthropic's and the Responses API's final error events are named ``error``; the
    Responses API's carries the error flat, numbered as the stream's next event."""
    error = from_backend(StreamBroken("cut"))
    assert error.sse().startswith(b'data: {"error":{')
    assert error.sse("anthropic").startswith(b'event: error\ndata: {"type":"error","error":{')
    name, data = error.sse("responses", 7).split(b"\n", 1)
    event = orjson.loads(data.removeprefix(b"data: "))
    assert name == b"event: error"
    assert event == {
        "type": "error",
        "code": "upstream_stream_broken",
        "message": "cut",
        "param": None,
        "sequence_number": 7,
    }


def test_anthropics_error_types_are_one_table_read_both_ways():
    """The gateway's answers and a Messages stream's error events read the same table: every
    type the gateway answers with maps back to its status (``overloaded_error`` and
    ``timeout_error`` were missing on the way back)."""
    for status, kind in ANTHROPIC_TYPES.items():
        assert ApiError(status=status, message="m").body("anthropic")["error"] == {
            "type": kind,
            "message": "m",
        }
        assert failure({"type": kind, "message": "m"}) == ("upstream error: m", status)
    assert anthropic_type(422) == "invalid_request_error" and anthropic_type(502) == "api_error"


def test_an_upstream_4xx_on_anthropics_routes_takes_anthropics_shape():
    vllm = {"error": {"message": "1 validation error", "type": "Bad Request", "code": 400}}
    translated = {"type": "error", "error": {"type": "NotFoundError", "message": "no model"}}
    cases = [(400, vllm, "invalid_request_error"), (404, translated, "not_found_error")]
    for status, body, kind in cases:
        answer = orjson.loads(anthropic_rejected(status, orjson.dumps(body)))
        message = body["error"]["message"]
        assert answer == {"type": "error", "error": {"type": kind, "message": message}}
    text = orjson.loads(anthropic_rejected(413, b"too big"))
    assert text["error"] == {"type": "request_too_large", "message": "too big"}
