"""Parsing: routing fields validated, everything else kept as sent."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import ApiError
from gateway.schema import parse


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
    _, payload = parse(orjson.dumps(body), "chat")
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
        parse(body, "chat")
    assert error.value.status == 400 and error.value.param == param
    assert message in error.value.message


def test_completions_need_a_prompt():
    with pytest.raises(ApiError) as error:
        parse(b'{"model": "m"}', "completion")
    assert error.value.param == "prompt"
