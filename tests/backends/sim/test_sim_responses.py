"""The rendered bodies and chunks against the real vLLM 0.32 captures (shapes, not text)."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from backends.sim.engine import SpecTally
from backends.sim.responses import DONE, Answer, ChunkWriter, error_body, full_body


def answer(*, chat: bool = True, usage: bool = True, tool: str | None = None) -> Answer:
    return Answer(
        chat=chat,
        request_id="chatcmpl-0123456789abcdef",
        created=1795319426,
        model="tiny",
        prompt_tokens=32,
        include_usage=usage,
        tool_name=tool,
        tool_call_id="chatcmpl-tool-1",
    )


def tally() -> SpecTally:
    t = SpecTally(4)
    for drafted, accepted in ((4, 4), (4, 3), (4, 4)):
        t.add(drafted, accepted)
    return t


def payloads(chunks: list[bytes]) -> list[object]:
    return [orjson.loads(c[6:]) for c in chunks if c != DONE]


def test_chat_stream_with_usage_matches_fixture(
    fixture_sse: Callable[[str], list[bytes]], json_shape: Callable[[object], object]
) -> None:
    real = [orjson.loads(e) for e in fixture_sse("chat-stream-include-usage.sse")[:-1]]
    w = ChunkWriter(answer())
    ours = payloads(
        [w.role(), w.content(" a"), w.content(" b c", finish_reason="length"), w.usage(9, tally())]
    )
    assert [json_shape(x) for x in ours] == [
        json_shape(real[0]),
        json_shape(real[1]),
        json_shape(real[-2]),
        json_shape(real[-1]),
    ]


def test_chat_stream_without_usage_matches_fixture(
    fixture_sse: Callable[[str], list[bytes]], json_shape: Callable[[object], object]
) -> None:
    real = [orjson.loads(e) for e in fixture_sse("chat-stream.sse")[:-1]]
    w = ChunkWriter(answer(usage=False))
    last = payloads([w.content("x", finish_reason="length")])[0]
    assert json_shape(last) == json_shape(real[-1])


def test_completions_stream_matches_fixture(
    fixture_sse: Callable[[str], list[bytes]], json_shape: Callable[[object], object]
) -> None:
    real = [orjson.loads(e) for e in fixture_sse("completions-stream-include-usage.sse")[:-1]]
    w = ChunkWriter(answer(chat=False))
    ours = payloads([w.content("\n"), w.content("\n", finish_reason="length"), w.usage(5, tally())])
    assert [json_shape(x) for x in ours] == [json_shape(x) for x in (real[0], real[-2], real[-1])]


def test_usage_numbers_and_spec_metrics() -> None:
    (usage,) = payloads([ChunkWriter(answer()).usage(20, tally())])
    assert isinstance(usage, dict)
    assert usage["usage"] == {"prompt_tokens": 32, "total_tokens": 52, "completion_tokens": 20}
    spec = usage["metrics"]["speculative_decoding"]
    assert spec["mean_acceptance_length"] == 1 + 11 / 3
    assert spec["draft_acceptance_rate"] == 11 / 12
    assert spec["acceptance_histogram"] == [0, 0, 0, 1, 2]
    assert (spec["num_spec_steps"], spec["num_draft_tokens"], spec["num_spec_tokens"]) == (3, 12, 4)
    (plain,) = payloads([ChunkWriter(answer()).usage(20, None)])
    assert isinstance(plain, dict) and "metrics" not in plain


def test_nonstream_body_matches_fixture(
    fixture_json: Callable[[str], object], json_shape: Callable[[object], object]
) -> None:
    ours = orjson.loads(full_body(answer(), "hi", "length", 32, tally()))
    assert json_shape(ours) == json_shape(fixture_json("chat-nonstream.json"))
    standard = orjson.loads(full_body(answer(), "hi", "stop", 3, None))
    assert standard["metrics"] is None  # vLLM: null without per-request metrics of any kind
    timed = orjson.loads(full_body(answer(), "hi", "stop", 3, None, {"mean_itl_ms": 2.0}))
    assert timed["metrics"]["mean_itl_ms"] == 2.0 and timed["metrics"]["queue_time_ms"] is None
    assert timed["metrics"]["speculative_decoding"] is None
    completion = orjson.loads(full_body(answer(chat=False), "hi", "stop", 3, None))
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"] == "hi"


def test_tool_call_deltas() -> None:
    w = ChunkWriter(answer(tool="get_weather"))
    named, more, last = payloads(
        [
            w.content("", first=True),
            w.content('{"a": 1'),
            w.content("}", finish_reason="tool_calls"),
        ]
    )
    assert isinstance(named, dict) and isinstance(more, dict) and isinstance(last, dict)
    assert named["choices"][0]["delta"]["tool_calls"] == [
        {
            "index": 0,
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    assert more["choices"][0]["delta"] == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1'}}]
    }
    assert last["choices"][0]["finish_reason"] == "tool_calls"
    body = orjson.loads(full_body(answer(tool="get_weather"), '{"a": 1}', "tool_calls", 4, None))
    message = body["choices"][0]["message"]
    assert message["content"] == ""  # vLLM: a named or required call leaves content ""
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"a": 1}'}


def test_error_shape(
    fixture_json: Callable[[str], object], json_shape: Callable[[object], object]
) -> None:
    ours = orjson.loads(error_body("The model `x` does not exist.", "NotFoundError", 404, "model"))
    assert json_shape(ours) == json_shape(fixture_json("error-unknown-model.json"))
