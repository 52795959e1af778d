"""The dialect of Anthropic's Messages API (``answer.py``'s ``Dialect``), as vLLM serves it at
``/v1/messages``: streamed events and whole bodies read into a ``Measurement``.

A stream is ``message_start``, then per content block ``content_block_start``, its
``content_block_delta`` events (``text_delta``, ``input_json_delta`` for a tool's input,
``thinking_delta``) and ``content_block_stop``, then ``message_delta`` with the stop reason
and the usage, and ``message_stop``; an ``error`` event in their place is the upstream's
error. vLLM writes one delta event per chunk of its chat stream, so deltas count engine
steps as chat chunks do; its Messages answers carry no per-request speculative metrics,
so on a speculative pool the chunk signal (or the pool's counters) is what measures them.
Usage is Anthropic's (``input_tokens``, ``output_tokens``), told to the measurement in
OpenAI's names. Pure.
"""

from __future__ import annotations

from typing import Any

from backends.errors import ANTHROPIC_STATUS
from gateway.measure.answer import Measurement

LAST = frozenset({"message_stop"})


class Messages:
    """``/v1/messages``."""

    __slots__ = ()
    last = LAST

    def event(
        self, measurement: Measurement, event: dict[str, Any], now: float
    ) -> tuple[str, int | None] | None:
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                text = delta.get("text")
                if text or delta.get("partial_json") or delta.get("thinking"):
                    measurement.content(now, None, text if isinstance(text, str) else "")
        elif kind == "message_delta":
            delta = event.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str) and reason:
                measurement.finished(reason)
            measurement.usage(openai_usage(event.get("usage")), None)
        elif kind == "error":
            return failure(event.get("error"))
        return None

    def whole(self, measurement: Measurement, body: dict[str, Any]) -> None:
        measurement.usage(openai_usage(body.get("usage")), None)
        reason = body.get("stop_reason")
        if isinstance(reason, str) and reason:
            measurement.finished(reason)
        measurement.answered(answer_text(body), None)


MESSAGES = Messages()


def openai_usage(usage: object) -> dict[str, Any]:
    """Anthropic's (and Responses') ``input_tokens``/``output_tokens`` in OpenAI's names,
    and the prompt tokens the engine's prefix cache held as chat's
    ``prompt_tokens_details.cached_tokens``: Messages' ``cache_read_input_tokens``,
    Responses' ``input_tokens_details.cached_tokens``. ``input_tokens`` is the whole prompt
    as the engines that serve it count it (Anthropic's own API counts only the uncached
    part)."""
    if not isinstance(usage, dict):
        return {}
    out: dict[str, Any] = {
        "prompt_tokens": usage.get("input_tokens") or 0,
        "completion_tokens": usage.get("output_tokens") or 0,
    }
    details = usage.get("input_tokens_details")
    cached = usage.get("cache_read_input_tokens")
    if cached is None and isinstance(details, dict):
        cached = details.get("cached_tokens")
    if isinstance(cached, int) and not isinstance(cached, bool):
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def failure(error: object) -> tuple[str, int | None]:
    """An Anthropic error object's message and the status its type stands for."""
    if not isinstance(error, dict):
        return f"upstream error: {error}", None
    kind = error.get("type")
    status = ANTHROPIC_STATUS.get(kind) if isinstance(kind, str) else None
    return f"upstream error: {error.get('message', '')}", status


def answer_text(body: dict[str, Any]) -> str:
    """The text blocks of a whole Messages answer."""
    content = body.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(
        str(block.get("text") or "")
        for block in content
        if isinstance(block, dict) and block.get("type") == "text"
    )
