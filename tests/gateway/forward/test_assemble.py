"""One JSON body from a stream: real vLLM chunks, tool calls, logprobs, n > 1."""

from __future__ import annotations

import json

import orjson
import pytest

from gateway.forward.assemble import Assembler
from tests.fakes import FIXTURES, events


def assemble(chat: bool, chunks: list[dict]) -> dict:
    assembler = Assembler(chat)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.body()


def parsed(name: str) -> list[dict]:
    return [orjson.loads(e) for e in events(name) if e != b"[DONE]"]


def without_nulls(answer: object) -> object:
    """An answer without ``id``, ``created`` and null fields, at every depth."""
    if isinstance(answer, dict):
        skip = ("id", "created")
        return {k: without_nulls(v) for k, v in answer.items() if v is not None and k not in skip}
    if isinstance(answer, list):
        return [without_nulls(v) for v in answer]
    return answer


def test_chat_stream_assembles_into_vllms_own_whole_answer():
    """Real vLLM 0.32, the same greedy request streamed and whole: field by field equal."""
    body = assemble(True, parsed("chat-stream-include-usage.sse"))
    reference = json.loads((FIXTURES / "chat-nonstream.json").read_text())
    assert without_nulls(body) == without_nulls(reference)
    assert body["object"] == reference["object"] == "chat.completion"
    choice, ref_choice = body["choices"][0], reference["choices"][0]
    assert choice["message"]["content"] == ref_choice["message"]["content"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == ref_choice["finish_reason"]
    assert body["usage"] == {k: v for k, v in reference["usage"].items() if v is not None}
    assert body["metrics"]["speculative_decoding"]["num_spec_steps"] == 5


def test_completions_stream_assembles_text():
    body = assemble(False, parsed("completions-stream-include-usage.sse"))
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"].count("\n") == 24
    assert body["usage"]["completion_tokens"] == 24


def test_tool_calls_are_merged_by_index():
    def delta(**d):
        return {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": d}]}

    chunks = [
        delta(role="assistant", content=""),
        delta(
            tool_calls=[
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        ),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
        delta(tool_calls=[{"index": 1, "id": "call_2", "function": {"name": "now"}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    body = assemble(True, chunks)
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "now"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert message["tool_calls"][0]["id"] == "call_1"
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_logprobs_and_several_choices():
    def chunk(index, text, lp):
        return {
            "id": "c",
            "choices": [
                {"index": index, "delta": {"content": text}, "logprobs": {"content": [lp]}}
            ],
        }

    body = assemble(
        True, [chunk(1, "b", {"t": 1}), chunk(0, "a", {"t": 0}), chunk(1, "c", {"t": 2})]
    )
    first, second = body["choices"]
    assert (first["index"], first["message"]["content"]) == (0, "a")
    assert second["message"]["content"] == "bc"
    assert second["logprobs"]["content"] == [{"t": 1}, {"t": 2}]


def fields(name: str) -> list[dict]:
    raw = (FIXTURES / "fields" / name).read_bytes()
    chunks = [block[6:] for block in raw.split(b"\n\n") if block.startswith(b"data: ")]
    return [orjson.loads(c) for c in chunks if c != b"[DONE]"]


@pytest.mark.parametrize(
    ("stream", "whole", "chat"),
    [
        (
            "chat-stream-logprobs-token-ids-running-usage.sse",
            "chat-nonstream-logprobs-token-ids.json",
            True,
        ),
        (
            "completions-stream-logprobs-token-ids-running-usage.sse",
            "completions-nonstream-logprobs-token-ids.json",
            False,
        ),
    ],
)
def test_logprobs_token_ids_and_running_usage_assemble_into_vllms_whole_answer(
    stream: str, whole: str, chat: bool
) -> None:
    """Real vLLM 0.32, one greedy request streamed (with running usage) and whole: every
    field the stream carries comes out as the whole answer has it. Only the timings in
    ``metrics`` differ, being two requests."""
    body = assemble(chat, fields(stream))
    reference = json.loads((FIXTURES / "fields" / whole).read_text())
    timings = ("metrics",)
    assert body["metrics"]["speculative_decoding"] == {
        k: v for k, v in reference["metrics"]["speculative_decoding"].items() if v is not None
    }
    body, reference = ({k: v for k, v in x.items() if k not in timings} for x in (body, reference))
    assert without_nulls(body) == without_nulls(reference)
    choice = body["choices"][0]
    assert choice["token_ids"] and choice["logprobs"] and body["usage"]["completion_tokens"] == 6
