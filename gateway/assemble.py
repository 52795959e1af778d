"""Build one non-streaming JSON body from the chunks of an upstream stream. Pure.

The gateway always streams from upstream; a client that asked for one JSON body gets the
chunks folded here: text and reasoning concatenated, tool calls merged by index, logprobs
appended, usage and vLLM's ``metrics`` kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class _Choice:
    index: int
    role: str = "assistant"
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: Any = None


class Assembler:
    """Feed parsed chunks in order; ``body`` gives the complete answer."""

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self._head: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._tail: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        if not self._head:
            self._head = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        for key in ("usage", "metrics", "system_fingerprint"):
            if chunk.get(key) is not None:
                self._tail[key] = chunk[key]
        for raw in chunk.get("choices") or ():
            index = int(raw.get("index", 0))
            choice = self._choices.get(index) or self._choices.setdefault(index, _Choice(index))
            self._add_choice(choice, raw)

    def _add_choice(self, choice: _Choice, raw: dict[str, Any]) -> None:
        if raw.get("finish_reason"):
            choice.finish_reason = raw["finish_reason"]
        if raw.get("stop_reason") is not None:
            choice.stop_reason = raw["stop_reason"]
        if raw.get("logprobs"):
            choice.logprobs = _merge_logprobs(choice.logprobs, raw["logprobs"])
        if not self._chat:
            choice.text.append(raw.get("text") or "")
            return
        delta = raw.get("delta") or {}
        choice.role = delta.get("role") or choice.role
        if delta.get("content"):
            choice.text.append(delta["content"])
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            choice.reasoning.append(reasoning)
        for call in delta.get("tool_calls") or ():
            _merge_call(choice.tool_calls, call)

    def body(self) -> dict[str, Any]:
        choices = [self._render(c) for _, c in sorted(self._choices.items())]
        obj = "chat.completion" if self._chat else "text_completion"
        return {**self._head, "object": obj, "choices": choices, **self._tail}

    def _render(self, choice: _Choice) -> dict[str, Any]:
        out: dict[str, Any] = {"index": choice.index}
        if self._chat:
            message: dict[str, Any] = {
                "role": choice.role,
                "content": "".join(choice.text) if choice.text or not choice.tool_calls else None,
            }
            if choice.reasoning:
                message["reasoning_content"] = "".join(choice.reasoning)
            if choice.tool_calls:
                message["tool_calls"] = [c for _, c in sorted(choice.tool_calls.items())]
            out["message"] = message
        else:
            out["text"] = "".join(choice.text)
        out["logprobs"] = choice.logprobs
        out["finish_reason"] = choice.finish_reason
        if choice.stop_reason is not None:
            out["stop_reason"] = choice.stop_reason
        return out


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
        elif key not in into:
            into[key] = value
    return into
