"""Build one non-streaming JSON body from the chunks of an upstream stream (step 8). Pure.

Used only where the pool's own whole answer is not asked for (``gateway/forward/passthrough.py``
sends every request a stream cannot carry exactly as it is), and then the body must be the
one the pool would have answered, field by field, as vLLM's whole answer builds it from the
same tokens:

- the top level: ``id``, ``created`` and ``model`` of the stream, then every other field at
  its last non-null value (``usage`` and ``metrics`` from the final usage chunk, the chat
  role chunk's ``prompt_token_ids``...);
- each choice, by ``index``: text, ``reasoning`` and every other text field of the delta
  concatenated, tool calls merged by index, ``logprobs`` lists and ``token_ids``
  concatenated, every other field (``finish_reason``, ``stop_reason``, a completion's
  ``prompt_token_ids``) at its last non-null value.

Fields vLLM leaves out of a stream but sets to null in a whole answer (``refusal``,
``annotations``, ``service_tier``, ``prompt_logprobs``, ``kv_transfer_params``, usage's
``*_details``, ``metrics`` itself when the pool reports none...) are set to null, in the
order vLLM 0.32 writes them (``_WHOLE``): the body has every field of the pool's own
answer, and equals it up to ``id`` and ``created``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_OWN = frozenset(("index", "delta", "text", "logprobs", "token_ids"))
_HEAD = ("id", "object", "created", "model")
# The fields of vLLM 0.32's whole answers, in its order, each null unless the stream set it.
_TOP = ("service_tier", "system_fingerprint", "usage")
_WHOLE = {
    True: (*_TOP, "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
           "ec_transfer_params", "metrics"),
    False: (*_TOP, "kv_transfer_params", "ec_transfer_params", "metrics"),
}  # fmt: skip
_CHOICE = {
    True: ("finish_reason", "stop_reason", "token_ids", "routed_experts"),
    False: ("finish_reason", "stop_reason", "token_ids", "prompt_logprobs", "prompt_token_ids",
            "routed_experts"),
}  # fmt: skip
_MESSAGE = ("refusal", "annotations", "audio", "function_call")  # then tool_calls, reasoning
_USAGE = ("prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
          "completion_tokens_details")  # fmt: skip
# what a whole answer's usage.prompt_tokens_details has and a stream's leaves out (vLLM 0.32
# with --enable-prompt-tokens-details: null in the whole answer, absent in the usage chunk)
_PROMPT_DETAILS = ("multimodal_tokens",)
_METRICS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
            "tokens_per_second", "speculative_decoding")  # fmt: skip
_PER_STEP = ("per_step_accepted", "per_step_drafted")  # a whole answer's speculative_decoding


@dataclass(slots=True)
class _Choice:
    index: int
    text: list[str] = field(default_factory=list)
    message: dict[str, Any] = field(default_factory=dict)  # chat: delta fields but content
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: dict[str, Any] | None = None
    token_ids: list[int] | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # choice-level, last non-null wins


class Assembler:
    """Feed parsed chunks in order; ``body`` gives the complete answer."""

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self._top: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        top = self._top
        for key, value in chunk.items():  # _keep, inlined: this runs for every chunk
            if (value is not None or key not in top) and key != "choices" and key != "object":
                top[key] = value
        for raw in chunk.get("choices") or ():
            index = int(raw.get("index", 0))
            choice = self._choices.get(index) or self._choices.setdefault(index, _Choice(index))
            self._add_choice(choice, raw)

    def _add_choice(self, choice: _Choice, raw: dict[str, Any]) -> None:
        fields = choice.fields
        for key, value in raw.items():
            if (value is not None or key not in fields) and key not in _OWN:
                fields[key] = value
        if raw.get("logprobs"):
            choice.logprobs = _merge_logprobs(choice.logprobs, raw["logprobs"])
        ids = raw.get("token_ids")
        if isinstance(ids, list):
            choice.token_ids = (choice.token_ids or []) + ids
        if not self._chat:
            choice.text.append(raw.get("text") or "")
            return
        for key, value in (raw.get("delta") or {}).items():
            if key == "content":
                choice.text.append(value or "")
            elif key == "tool_calls":
                for call in value or ():
                    _merge_call(choice.tool_calls, call)
            elif isinstance(value, str) and key != "role":
                choice.message[key] = choice.message.get(key, "") + value
            else:
                _keep(choice.message, key, value)

    def body(self) -> dict[str, Any]:
        top = self._top
        whole = {"object": "chat.completion" if self._chat else "text_completion"}
        head: dict[str, Any] = {k: whole.get(k, top.get(k)) for k in _HEAD}
        head["choices"] = [self._render(c) for _, c in sorted(self._choices.items())]
        body = _ordered(head, top, _WHOLE[self._chat])
        if isinstance(body["usage"], dict):
            body["usage"] = usage = _ordered({}, body["usage"], _USAGE)
            details = usage["prompt_tokens_details"]
            if isinstance(details, dict):
                usage["prompt_tokens_details"] = details | {
                    k: details.get(k) for k in _PROMPT_DETAILS
                }
        metrics = body["metrics"]
        if isinstance(metrics, dict):
            body["metrics"] = metrics = _ordered({}, metrics, _METRICS)
            if isinstance(metrics["speculative_decoding"], dict):
                spec = metrics["speculative_decoding"]
                metrics["speculative_decoding"] = spec | {k: spec.get(k) for k in _PER_STEP}
        return body

    def _render(self, choice: _Choice) -> dict[str, Any]:
        out: dict[str, Any] = {"index": choice.index}
        if self._chat:
            message = {"role": choice.message.get("role") or "assistant"}
            text = "".join(choice.text)
            message["content"] = text if text or not choice.tool_calls else None
            message |= {k: choice.message.get(k) for k in _MESSAGE}
            if choice.tool_calls:
                message["tool_calls"] = [c for _, c in sorted(choice.tool_calls.items())]
            message["reasoning"] = choice.message.get("reasoning")
            out["message"] = message | {k: v for k, v in choice.message.items() if k != "role"}
        else:
            out["text"] = "".join(choice.text)
        out["logprobs"] = choice.logprobs
        fields = choice.fields | {"token_ids": choice.token_ids}
        return _ordered(out, fields, _CHOICE[self._chat])


def _ordered(head: dict[str, Any], given: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``head``, then ``names`` in order (each null where ``given`` lacks it), then the rest
    of ``given``."""
    out = head | {k: given.get(k) for k in names}
    return out | {k: v for k, v in given.items() if k not in out}


def _keep(into: dict[str, Any], key: str, value: Any) -> None:
    """The last non-null value, in the order keys first appeared."""
    if value is not None or key not in into:
        into[key] = value


def _merge_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = int(delta.get("index", len(calls)))
    call = calls.setdefault(
        index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


def _merge_logprobs(into: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    if into is None:
        return {k: list(v) if isinstance(v, list) else v for k, v in new.items()}
    for key, value in new.items():
        if isinstance(value, list) and isinstance(into.get(key), list):
            into[key].extend(value)
        elif into.get(key) is None:
            into[key] = list(value) if isinstance(value, list) else value
    return into
