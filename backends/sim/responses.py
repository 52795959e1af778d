"""vLLM 0.32 response bodies and SSE chunks, byte for byte in the fixtures' shapes.

Key order follows ``/work/shared/fixtures/vllm-0.32.0-cpu-ngram-k4``. Content chunks are
built from per-request byte templates (they are the hot path of the zero-latency benchmark);
everything else goes through orjson.

Pure: no I/O, no clock (``created`` comes in), no knowledge of the engine's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from backends.sim.engine import SpecTally
from backends.sim.logprobs import chat_logprobs, completion_logprobs, prompt_logprobs, token_id

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


def usage(prompt_tokens: int, completion_tokens: int, cached: int | None = None) -> Json:
    """A usage object; ``cached`` (prompt tokens found in the prefix cache) adds
    ``prompt_tokens_details`` as vLLM does with ``--enable-prompt-tokens-details``."""
    out: Json = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def cached_of(used: Mapping[str, Any]) -> int:
    """The cached prompt tokens a usage object reports (0: none or not reported)."""
    details = used.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return value if isinstance(value, int) else 0


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
    logprobs: int | None = None  # top logprobs per token, None when not asked for
    token_ids: bool = False  # return_token_ids
    prompt_ids: tuple[int, ...] = ()
    prompt_logprobs: int | None = None
    key: str = ""  # what the answer's logprobs are drawn from
    continuous_usage: bool = False  # stream_options.continuous_usage_stats with include_usage

    @property
    def plain(self) -> bool:
        """Chunks carry no per-token extras: the byte templates suffice."""
        return self.logprobs is None and not self.token_ids and not self.continuous_usage

    def running_usage(self, completion_tokens: int) -> bytes:
        """``,"usage":{...}`` of a chunk when usage runs with the stream (vLLM sets the
        details field explicitly in chat streams, so it shows as null there)."""
        used = usage(self.prompt_tokens, completion_tokens)
        if self.chat:
            used["completion_tokens_details"] = None
        return b',"usage":' + orjson.dumps(used)

    def extras(self, pieces: Sequence[str], start: int, offset: int = 0) -> Json:
        """``logprobs`` and ``token_ids`` of a choice holding tokens ``start..``."""
        out: Json = {"logprobs": None}
        if self.logprobs is not None:
            out["logprobs"] = (
                chat_logprobs(pieces, start, self.logprobs, self.key)
                if self.chat
                else completion_logprobs(pieces, start, offset, self.logprobs, self.key)
            )
        out["token_ids"] = [token_id(p) for p in pieces] if self.token_ids else None
        return out


class ChunkWriter:
    """SSE ``data:`` lines of one streamed answer."""

    def __init__(self, answer: Answer, index: int = 0) -> None:
        """One writer per choice: ``index`` is the choice's (``n`` > 1)."""
        self.answer = answer
        self.index = index
        self._offset = 0  # characters sent so far: completions logprobs count text offsets
        self._sent = 0  # tokens sent so far
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
        self._head = b"data: " + self._envelope + b',"choices":[{"index":%d,' % index + field

    def role(self) -> bytes:
        """The chat stream's first chunk (completions streams have none)."""
        answer = self.answer
        ids = list(answer.prompt_ids) if answer.token_ids else None
        running = answer.running_usage(0) if answer.continuous_usage else b""
        return (
            b"data: "
            + self._envelope
            + b',"choices":[{"index":%d,"delta":{"role":"assistant","content":""},' % self.index
            + b'"logprobs":null,"finish_reason":null}]'
            + running
            + b',"prompt_token_ids":'
            + orjson.dumps(ids)
            + b',"prompt_text":null}\n\n'
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
                "id": answer.tool_call_id,
                "type": "function",
                "index": 0,
                "function": {"name": answer.tool_name, "arguments": text},
            }
        return orjson.dumps({"tool_calls": [call]})

    def content(
        self,
        text: str,
        *,
        first: bool = False,
        finish_reason: str | None = None,
        pieces: Sequence[str] = (),
        start: int = 0,
    ) -> bytes:
        """One chunk of new tokens (``pieces``, the first at position ``start``); the last
        one also carries ``finish_reason``."""
        value = self._value(text, first)
        answer = self.answer
        if finish_reason is None and answer.plain:
            return self._head + value + (_NULLS_CHAT if answer.chat else _NULLS_TEXT)
        extras = answer.extras(pieces, start, self._offset)
        self._offset += len(text)
        self._sent += len(pieces)
        tail: Json = {"logprobs": extras["logprobs"], "finish_reason": finish_reason}
        if finish_reason is not None or not answer.chat:
            tail["stop_reason"] = None
        if not answer.chat:
            ids = list(answer.prompt_ids) if answer.token_ids and first else None
            tail["prompt_token_ids"] = ids
        tail["token_ids"] = extras["token_ids"]
        closing = b"]"
        if answer.continuous_usage:
            closing += answer.running_usage(self._sent)
        elif finish_reason is not None and not answer.include_usage:
            closing = b'],"system_fingerprint":"%s"' % (FINGERPRINT.encode())
        return self._head + value + b"," + orjson.dumps(tail)[1:] + closing + b"}\n\n"

    def usage(
        self,
        completion_tokens: int,
        tally: SpecTally | None,
        timings: Timings | None = None,
        cached: int | None = None,
    ) -> bytes:
        """The final chunk of an ``include_usage`` stream: no choices, usage and metrics (only
        their non-null fields, as vLLM leaves nulls out of streamed chunks)."""
        body = orjson.loads(self._envelope + b"}")
        body["choices"] = []
        body["usage"] = usage(self.answer.prompt_tokens, completion_tokens, cached)
        body["system_fingerprint"] = FINGERPRINT
        metrics = _metrics(tally, timings, per_step=False)
        if metrics is not None:
            body["metrics"] = {k: v for k, v in metrics.items() if v is not None}
        return b"data: " + orjson.dumps(body) + b"\n\n"


TIMING_FIELDS = (
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
)
Timings = dict[str, float | None]


def _metrics(tally: SpecTally | None, timings: Timings | None, *, per_step: bool) -> Json | None:
    """vLLM's ``metrics``: null unless the server reports timings or speculative counts."""
    if tally is None and timings is None:
        return None
    out: Json = dict.fromkeys(TIMING_FIELDS)
    out.update(timings or {})
    out["speculative_decoding"] = None if tally is None else spec_metrics(tally, per_step=per_step)
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
    if answer.tool_name is not None:  # a tool_choice that names or requires a call
        message["content"] = ""
        message["tool_calls"] = [
            {
                "id": answer.tool_call_id,
                "type": "function",
                "function": {"name": answer.tool_name, "arguments": text},
            }
        ]
    message["reasoning"] = None
    return message


class Ending(NamedTuple):
    """One choice of a whole answer: its tokens' text pieces and why it ended."""

    pieces: Sequence[str]
    finish_reason: str


def full_body(
    answer: Answer,
    text: str,
    finish_reason: str,
    completion_tokens: int,
    tally: SpecTally | None,
    timings: Timings | None = None,
    pieces: Sequence[str] = (),
) -> bytes:
    """The non-streaming answer of one choice (``text`` is ``pieces`` joined)."""
    ending = Ending(pieces or [text], finish_reason)
    return whole_body(answer, [ending], completion_tokens, tally, timings)


def _choice(answer: Answer, index: int, ending: Ending, prompt: object) -> Json:
    text = "".join(ending.pieces)
    choice: Json = {"index": index}
    if answer.chat:
        choice["message"] = _chat_message(answer, text)
    else:
        choice["text"] = text
    extras = answer.extras(ending.pieces, 0)
    choice.update(logprobs=extras["logprobs"], finish_reason=ending.finish_reason, stop_reason=None)
    choice["token_ids"] = extras["token_ids"]
    if not answer.chat:
        choice["prompt_logprobs"] = prompt
        choice["prompt_token_ids"] = list(answer.prompt_ids) if answer.token_ids else None
    choice["routed_experts"] = None
    return choice


def whole_body(
    answer: Answer,
    endings: Sequence[Ending],
    completion_tokens: int,
    tally: SpecTally | None,
    timings: Timings | None = None,
    cached: int | None = None,
) -> bytes:
    """The non-streaming answer (``chat.completion`` or ``text_completion``), one choice
    per ending; ``cached`` as for ``usage``."""
    asked = answer.prompt_logprobs
    prompt = prompt_logprobs(answer.prompt_ids, asked) if asked is not None else None
    prompt_ids = list(answer.prompt_ids) if answer.token_ids else None
    body: Json = {
        "id": answer.request_id,
        "object": "chat.completion" if answer.chat else "text_completion",
        "created": answer.created,
        "model": answer.model,
        "choices": [_choice(answer, i, e, prompt) for i, e in enumerate(endings)],
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": usage(answer.prompt_tokens, completion_tokens)
        | {
            "prompt_tokens_details": {"cached_tokens": cached} if cached else None,
            "completion_tokens_details": None,
        },
    }
    if answer.chat:
        body.update(prompt_logprobs=prompt, prompt_token_ids=prompt_ids, prompt_text=None)
    metrics = _metrics(tally, timings, per_step=True)
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=metrics)
    return orjson.dumps(body)
