"""vLLM 0.32 response bodies and SSE chunks, byte for byte in the fixtures' shapes.

Key order follows ``/work/shared/fixtures/vllm-0.32.0-cpu-ngram-k4``. Content chunks are
built from per-request byte templates (they are the hot path of the zero-latency benchmark);
everything else goes through orjson.

Pure: no I/O, no clock (``created`` comes in), no knowledge of the engine's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from backends.sim.engine import SpecTally

FINGERPRINT = "vllm-0.32.0-speclane-sim"
DONE = b"data: [DONE]\n\n"
_NULLS_CHAT = b',"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
_NULLS_TEXT = (
    b',"logprobs":null,"finish_reason":null,"stop_reason":null,'
    b'"prompt_token_ids":null,"token_ids":null}]}\n\n'
)

Json = dict[str, Any]


def error_body(message: str, type_: str, code: int, param: str | None = None) -> bytes:
    """vLLM's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def spec_metrics(tally: SpecTally, *, per_step: bool) -> Json:
    """``metrics.speculative_decoding``; the non-streaming body adds the per-step nulls."""
    out: Json = {
        "mean_acceptance_length": tally.mean_acceptance_length,
        "draft_acceptance_rate": tally.draft_acceptance_rate,
        "acceptance_histogram": list(tally.histogram),
        "num_spec_steps": tally.num_spec_steps,
        "num_accepted_draft_tokens": tally.num_accepted_draft_tokens,
        "num_draft_tokens": tally.num_draft_tokens,
        "num_spec_tokens": tally.k,
    }
    if per_step:
        out["per_step_accepted"] = None
        out["per_step_drafted"] = None
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> Json:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


@dataclass(frozen=True, slots=True)
class Answer:
    """Who one answer is for and how it is framed. ``chat`` False means ``/v1/completions``."""

    chat: bool
    request_id: str
    created: int
    model: str
    prompt_tokens: int
    include_usage: bool
    tool_name: str | None = None
    tool_call_id: str = ""


class ChunkWriter:
    """SSE ``data:`` lines of one streamed answer."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        obj = "chat.completion.chunk" if answer.chat else "text_completion"
        self._envelope = (
            b'{"id":'
            + orjson.dumps(answer.request_id)
            + b',"object":"'
            + obj.encode()
            + b'","created":'
            + str(answer.created).encode()
            + b',"model":'
            + orjson.dumps(answer.model)
        )
        field = b'"delta":' if answer.chat else b'"text":'
        self._head = b"data: " + self._envelope + b',"choices":[{"index":0,' + field

    def role(self) -> bytes:
        """The chat stream's first chunk (completions streams have none)."""
        return (
            b"data: "
            + self._envelope
            + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}],'
            b'"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def _value(self, text: str, first: bool) -> bytes:
        answer = self.answer
        if not answer.chat:
            return orjson.dumps(text)
        if answer.tool_name is None:
            return orjson.dumps({"content": text})
        call: Json = {"index": 0, "function": {"arguments": text}}
        if first:
            call = {
                "index": 0,
                "id": answer.tool_call_id,
                "type": "function",
                "function": {"name": answer.tool_name, "arguments": text},
            }
        return orjson.dumps({"tool_calls": [call]})

    def content(self, text: str, *, first: bool = False, finish_reason: str | None = None) -> bytes:
        """One chunk of new tokens; the last one also carries ``finish_reason``."""
        value = self._value(text, first)
        if finish_reason is None:
            return self._head + value + (_NULLS_CHAT if self.answer.chat else _NULLS_TEXT)
        tail: Json = {"logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        if not self.answer.chat:
            tail["prompt_token_ids"] = None
        tail["token_ids"] = None
        closing = (
            b"]"
            if self.answer.include_usage
            else b'],"system_fingerprint":"%s"' % (FINGERPRINT.encode())
        )
        return self._head + value + b"," + orjson.dumps(tail)[1:] + closing + b"}\n\n"

    def usage(self, completion_tokens: int, tally: SpecTally | None) -> bytes:
        """The final chunk of an ``include_usage`` stream: no choices, usage and metrics."""
        body = orjson.loads(self._envelope + b"}")
        body["choices"] = []
        body["usage"] = usage(self.answer.prompt_tokens, completion_tokens)
        body["system_fingerprint"] = FINGERPRINT
        if tally is not None:
            body["metrics"] = {"speculative_decoding": spec_metrics(tally, per_step=False)}
        return b"data: " + orjson.dumps(body) + b"\n\n"


def _metrics(tally: SpecTally | None) -> Json:
    out: Json = {
        "time_to_first_token_ms": None,
        "generation_time_ms": None,
        "queue_time_ms": None,
        "mean_itl_ms": None,
        "tokens_per_second": None,
    }
    if tally is not None:
        out["speculative_decoding"] = spec_metrics(tally, per_step=True)
    return out


def _chat_message(answer: Answer, text: str) -> Json:
    message: Json = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if answer.tool_name is not None:
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": answer.tool_call_id,
                "type": "function",
                "function": {"name": answer.tool_name, "arguments": text},
            }
        ]
    message["reasoning"] = None
    return message


def full_body(
    answer: Answer, text: str, finish_reason: str, completion_tokens: int, tally: SpecTally | None
) -> bytes:
    """The non-streaming answer (``chat.completion`` or ``text_completion``)."""
    choice: Json = {"index": 0}
    if answer.chat:
        choice["message"] = _chat_message(answer, text)
    else:
        choice["text"] = text
    choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
    if not answer.chat:
        choice["prompt_logprobs"] = None
        choice["prompt_token_ids"] = None
    choice["token_ids"] = None
    if answer.chat:
        choice["routed_experts"] = None
    body: Json = {
        "id": answer.request_id,
        "object": "chat.completion" if answer.chat else "text_completion",
        "created": answer.created,
        "model": answer.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": usage(answer.prompt_tokens, completion_tokens)
        | {"prompt_tokens_details": None, "completion_tokens_details": None},
    }
    if answer.chat:
        body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=_metrics(tally))
    return orjson.dumps(body)
