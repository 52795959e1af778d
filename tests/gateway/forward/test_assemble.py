"""One JSON body from a stream: real vLLM chunks, tool calls, logprobs, n > 1. Every
recorded stream assembles into the recorded whole answer of the same request, field by
field, its nulls included."""

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
    assert body["usage"] == reference["usage"]
    assert body["metrics"]["speculative_decoding"]["num_spec_steps"] == 5


def shape(answer: object, path: str = "") -> list[str]:
    """Every field's path, in order, and the kind of its value (null, text, number...)."""
    if isinstance(answer, dict):
        return [f for k, v in answer.items() for f in [f"{path}.{k}", *shape(v, f"{path}.{k}")]]
    if isinstance(answer, list):
        return [f for v in answer[:1] for f in shape(v, path + "[]")]
    return [f"{path}: {type(answer).__name__}"]


def values(answer: dict) -> dict:
    """An answer's values that one request's streamed and whole answers share: not its ``id``
    and ``created``, nor the timings of ``metrics`` (two requests, two timings)."""
    out = {k: v for k, v in answer.items() if k not in ("id", "created", "metrics")}
    metrics = answer.get("metrics")
    if isinstance(metrics, dict):
        out["metrics"] = {k: v for k, v in metrics.items() if not k.endswith(("_ms", "_second"))}
    return out


RECORDED = [  # (stream, whole answer, chat): one greedy request each, of one server
    *(
        (f"{server}/chat-stream-include-usage.sse", f"{server}/chat-nonstream.json", True)
        for server in ("standard", "ngram", "draft")
    ),
    ("chat-stream-include-usage.sse", "chat-nonstream.json", True),
    (
        "fields/chat-stream-logprobs-token-ids-running-usage.sse",
        "fields/chat-nonstream-logprobs-token-ids.json",
        True,
    ),
    (
        "fields/completions-stream-logprobs-token-ids-running-usage.sse",
        "fields/completions-nonstream-logprobs-token-ids.json",
        False,
    ),
]


@pytest.mark.parametrize(("stream", "whole", "chat"), RECORDED)
def test_every_recorded_stream_assembles_into_every_field_of_its_whole_answer(
    stream: str, whole: str, chat: bool
) -> None:
    """What a client gets assembled from a speculative pool's stream has the fields the
    pool's own whole answer has, in its order, nulls included (``refusal``, ``annotations``,
    ``service_tier``, ``prompt_logprobs``, ``kv_transfer_params``, usage's details...), and
    their values, but for ``id``, ``created`` and the timings of ``metrics``."""
    body = assemble(chat, parsed(stream))
    reference = json.loads((FIXTURES / whole).read_text())
    assert shape(body) == shape(reference)
    if stream.startswith("draft/"):  # a draft model's steps vary between two requests
        for answer in (body, reference):
            answer["metrics"].pop("speculative_decoding")
    assert values(body) == values(reference)


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
    assert body["metrics"]["speculative_decoding"] == reference["metrics"]["speculative_decoding"]
    body, reference = ({k: v for k, v in x.items() if k not in timings} for x in (body, reference))
    assert without_nulls(body) == without_nulls(reference)
    assert body.keys() == reference.keys()
    choice = body["choices"][0]
    assert choice["token_ids"] and choice["logprobs"] and body["usage"]["completion_tokens"] == 6


def test_a_usage_chunk_s_prompt_details_get_the_null_fields_a_whole_answer_has():
    # vLLM 0.32 with --enable-prompt-tokens-details: the whole answer's prompt_tokens_details
    # has multimodal_tokens (null); its stream's usage chunk leaves it out
    a = Assembler(chat=False)
    a.add({"id": "c", "object": "text_completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}]})  # fmt: skip
    details = {"cached_tokens": 16, "created_cache_tokens": 0}
    a.add({"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [],
           "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21,
                     "prompt_tokens_details": details}})  # fmt: skip
    got = a.body()["usage"]["prompt_tokens_details"]
    assert got == details | {"multimodal_tokens": None}
