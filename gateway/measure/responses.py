"""The dialect of OpenAI's Responses API (``answer.py``'s ``Dialect``), as vLLM serves it at
``/v1/responses``: streamed events and whole bodies read into a ``Measurement``.

A stream is ``response.created`` and ``response.in_progress``, then the output items
(``response.output_item.added``, ``response.output_text.delta`` for text,
``response.function_call_arguments.delta`` for a tool call's arguments,
``response.reasoning_text.delta`` for reasoning, then their ``.done`` events), then
``response.completed`` with the whole response and its usage (vLLM's last event also for an
answer stopped at ``max_output_tokens``, ``"status": "incomplete"`` inside; a
``response.incomplete``, where a server sends one, ends it too);
``response.failed`` or an ``error`` event is the upstream's error. vLLM writes one delta
event per engine output, so deltas count engine steps as chat chunks do; its Responses
answers carry no per-request speculative metrics. The response's ``id`` (of the whole
answer, or of ``response.created``) is told to the measurement (``response_id``): a later
request that continues it (``previous_response_id``) must reach the endpoint that stored
it. Pure.
"""

from __future__ import annotations

from typing import Any

from gateway.measure.answer import Measurement
from gateway.measure.messages import openai_usage

_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
    }
)
_ENDS = frozenset({"response.completed", "response.incomplete"})
LAST = _ENDS | {"response.failed"}


class Responses:
    """``/v1/responses``."""

    __slots__ = ()
    last = LAST

    def event(
        self, measurement: Measurement, event: dict[str, Any], now: float
    ) -> tuple[str, int | None] | None:
        kind = event.get("type")
        if kind in _DELTAS:
            delta = event.get("delta")
            text = delta if kind == "response.output_text.delta" else None
            if delta:
                measurement.content(now, None, text if isinstance(text, str) else "")
        elif kind in _ENDS:
            response = event.get("response")
            if isinstance(response, dict):
                _ended(measurement, response)
        elif kind == "response.created":
            response = event.get("response")
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                measurement.response_id(response["id"])
        elif kind == "response.failed":
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            return _failure(error)
        elif kind == "error":
            return _failure(event)
        return None

    def whole(self, measurement: Measurement, body: dict[str, Any]) -> None:
        if isinstance(body.get("id"), str):
            measurement.response_id(body["id"])
        _ended(measurement, body)
        measurement.answered(answer_text(body), None)


RESPONSES = Responses()


def _ended(measurement: Measurement, response: dict[str, Any]) -> None:
    measurement.usage(openai_usage(response.get("usage")), None)
    incomplete = response.get("incomplete_details")
    reason = incomplete.get("reason") if isinstance(incomplete, dict) else None
    status = response.get("status")
    if isinstance(reason, str) and reason:
        measurement.finished(reason)
    elif isinstance(status, str) and status:
        measurement.finished(status)


def _failure(error: object) -> tuple[str, int | None]:
    if not isinstance(error, dict):
        return "upstream error: the response failed", None
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    return f"upstream error: {error.get('message', '')}", status


def answer_text(body: dict[str, Any]) -> str:
    """The output text of a whole Responses answer."""
    out = []
    for item in body.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    out.append(str(part.get("text") or ""))
    return "".join(out)
