"""Parsing: routing fields validated, everything else kept as sent."""

from __future__ import annotations

import orjson
import pytest

from gateway.apis import named
from gateway.errors import ApiError
from gateway.schema import (
    ChatRequest,
    CompletionRequest,
    MessagesRequest,
    ResponsesRequest,
    parse,
)


def test_unknown_fields_pass_through_untouched():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x", "name": "bob"}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "logprobs": True,
        "top_logprobs": 3,
        "guided_json": {"type": "object"},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    _, payload = parse(orjson.dumps(body), ChatRequest)
    assert payload == body


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (b"{", None, "not valid JSON"),
        (b'"text"', None, "JSON object"),
        (b'{"model": "m"}', "messages", "'messages' is required"),
        (b'{"model": "", "messages": [{"role": "u"}]}', "model", "at least 1 character"),
        (b'{"model": "m", "messages": [{"role": "u"}], "n": 0}', "n", "greater than or equal"),
        (b'{"model": "m", "messages": [{"role": "u"}], "top_p": 0}', "top_p", "greater than"),
        (b'{"model": "m", "messages": [{"role": "u"}], "stream": "maybe"}', "stream", "boolean"),
        (
            b'{"model": "m", "messages": [{"role": "u"}], "tools": [{"function": {}}]}',
            "tools.0.function.name",
            "required",
        ),
    ],
)
def test_bad_chat_bodies_name_the_field(body, param, message):
    with pytest.raises(ApiError) as error:
        parse(body, ChatRequest)
    assert error.value.status == 400 and error.value.param == param
    assert message in error.value.message


@pytest.mark.parametrize(
    ("model", "body", "param", "message"),
    [
        (ResponsesRequest, {"input": []}, "input", "at least 1 item"),
        (ResponsesRequest, {"input": [3]}, "input.0", "valid dictionary"),
        (CompletionRequest, {"prompt": ""}, "prompt", "at least 1 character"),
        (CompletionRequest, {"prompt": [[1, "a"]]}, "prompt.0.1", "valid integer"),
        (CompletionRequest, {"prompt": ["a", 3]}, "prompt.1", "valid string"),
        (ChatRequest, {"messages": [{"role": "u", "content": 5}]}, "messages.0.content", ""),
        (
            MessagesRequest,
            {"max_tokens": 4, "messages": [{"role": "u", "content": "x"}], "system": 5},
            "system",
            "",
        ),
    ],
)
def test_a_field_of_several_types_is_named_as_sent(model, body, param, message):
    """A field that may be a string or a list is named by its place in the body, never by
    pydantic's name for a type it tried (``input.constrained-str``), and an empty list is
    said to be empty, not to be no string."""
    with pytest.raises(ApiError) as error:
        parse(orjson.dumps({"model": "m"} | body), model)
    assert error.value.status == 400 and error.value.param == param
    assert error.value.message.startswith(f"'{param}'") and message in error.value.message


def test_completions_need_a_prompt():
    with pytest.raises(ApiError) as error:
        parse(b'{"model": "m"}', CompletionRequest)
    assert error.value.param == "prompt"


def nested(levels: int) -> bytes:
    """A chat body whose deepest value sits ``levels`` arrays and objects down."""
    inner = "[" * (levels - 5) + "1" + "]" * (levels - 5)
    return (
        '{"model": "m", "messages": [{"role": "u", "content": [{"x": ' + inner + "}]}]}"
    ).encode()


@pytest.mark.parametrize("levels", [129, 254, 300, 1023, 1100, 100_000])
def test_one_depth_limit_for_every_depth_past_it(levels):
    with pytest.raises(ApiError) as refused:
        parse(nested(levels), ChatRequest)
    assert refused.value.status == 400
    assert "nested deeper than 128" in refused.value.message or "not valid JSON" in (
        refused.value.message
    )


def test_the_deepest_body_accepted_can_be_written_out_again():
    _, payload = parse(nested(128), ChatRequest)
    assert orjson.loads(orjson.dumps(payload)) == payload


@pytest.mark.parametrize("kind", ["chat", "messages", "responses"])
@pytest.mark.parametrize(("sent", "read"), [("yes", True), (1, True), ("false", False)])
def test_a_stream_read_from_another_type_is_forwarded_as_the_boolean_read(kind, sent, read):
    """The upstream streams exactly when routing expects it to: a Messages or Responses
    stream is relayed as the upstream sends it."""
    body = {"model": "m", "stream": sent, "max_tokens": 4}
    turn = {"role": "user", "content": "x"}
    body |= {"input": "x"} if kind == "responses" else {"messages": [turn]}
    parsed, payload = parse(orjson.dumps(body), named(kind).model)
    assert parsed.stream is read and payload["stream"] is read
