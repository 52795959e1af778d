"""The dialect of OpenAI's chat and text completions (``answer.py``'s ``Dialect``), as every
engine answers them: streamed chunks and whole bodies read into a ``Measurement``.

A chunk's choices carry output (``content``, ``text``, ``tool_calls``, ``reasoning``) and
the finish reason; the final usage chunk carries ``usage``; an error object without choices
is an error event. What a chunk or a body says of the answer's speculation and its times
is the engine's to read (``Measurement.said``, ``Measurement.usage``, ``gateway/engines/``),
and so is a chunk the engine adds of its own (``Measurement.own``): its usage, if it has
any, is not the answer's. Pure.
"""

from __future__ import annotations

from typing import Any

from gateway.measure.answer import Measurement


class Completions:
    """``/v1/chat/completions`` and ``/v1/completions``."""

    __slots__ = ()
    last = None  # a stream of data chunks, ended by [DONE]

    def event(
        self, measurement: Measurement, event: dict[str, Any], now: float
    ) -> tuple[str, int | None] | None:
        choices = event.get("choices")
        if choices:
            for choice in choices:  # the hot path: one call per chunk, the rest inline
                if measurement.structure is not None:
                    measurement.structure.delta(choice)
                delta = choice.get("delta") or choice
                finish = choice.get("finish_reason")
                if (
                    delta.get("content")
                    or delta.get("text")
                    or delta.get("tool_calls")
                    or delta.get("reasoning_content")
                    or delta.get("reasoning")
                ):
                    first = choice.get("index", 0) == 0
                    text = (delta.get("content") or delta.get("text") or "") if first else None
                    measurement.content(now, finish, text)
                elif finish:
                    measurement.finished(finish)
        elif "error" in event:
            return _failure(event["error"])
        elif "usage" in event and not measurement.own(event):
            measurement.usage(event["usage"] or {}, event)
        measurement.said(event)
        return None

    def whole(self, measurement: Measurement, body: dict[str, Any]) -> None:
        measurement.usage(body.get("usage") or {}, body)
        measurement.said_whole(body)
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if isinstance(reason, str) and reason:
                measurement.finished(reason)
        if measurement.structure is not None:
            measurement.structure.body(body)
        measurement.answered(answer_text(body), body)


COMPLETIONS = Completions()


def _failure(error: object) -> tuple[str, int | None]:
    message = error.get("message", "") if isinstance(error, dict) else str(error)
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    return f"upstream error: {message}", status


def answer_text(answer: dict[str, Any]) -> str:
    """The text of the first choice of a chat or completions body."""
    choices = answer.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text or ""
