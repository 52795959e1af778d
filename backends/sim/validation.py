"""Reading one OpenAI request body the way vLLM validates it, for the simulated server.

Turns raw bytes into a checked ``Ask`` or raises ``SimHTTPError`` carrying vLLM's status and
error body (invalid JSON 400, unknown model 404, missing messages/prompt 400, ``n`` != 1 400,
bad or too large ``max_tokens`` 400).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from backends.sim.responses import error_body
from backends.sim.workload import estimate_prompt_tokens


class SimHTTPError(Exception):
    """An error answer of the simulated server, already in vLLM's shape."""

    def __init__(self, status: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, status, param)


def bad_request(message: str, param: str | None = None) -> SimHTTPError:
    return SimHTTPError(400, message, "Bad Request", param)


@dataclass(frozen=True, slots=True)
class Ask:
    """A validated request: its body plus what the server needs from it."""

    body: Mapping[str, Any]
    chat: bool
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int
    prompt_tokens: int


def _load(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        message = (
            f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body.{exc.pos}', "
            f"'msg': 'JSON decode error', 'input': '<dict of 0 items>', "
            f"'ctx': {{'error': {exc.msg!r}}}}}"
        )
        raise bad_request(message, f"body.{exc.pos}") from exc
    if not isinstance(body, dict):
        raise bad_request("Input should be a valid dictionary or object", "body")
    return body


def _missing(field: str) -> SimHTTPError:
    detail = f"{{'type': 'missing', 'loc': ('body', {field!r}), 'msg': 'Field required'}}"
    return bad_request(f"1 validation error:\n  {detail}", field)


def _model(body: Mapping[str, Any], names: tuple[str, ...]) -> str:
    model = body.get("model")
    if model is None:
        return names[0]
    if model not in names:
        message = f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}."
        raise SimHTTPError(404, message, "NotFoundError", "model")
    return str(model)


def _max_tokens(body: Mapping[str, Any], default: int, room: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad_request(f"{key} must be at least 1, got {value!r}.", key)
        if value > room:
            raise bad_request(
                f"This model's maximum context length is exceeded: {key} is {value} but only "
                f"{room} tokens are left after the prompt.",
                key,
            )
        return value
    return min(default, room)


def parse(
    raw: bytes,
    *,
    chat: bool,
    names: tuple[str, ...],
    default_max_tokens: int,
    max_model_len: int,
) -> Ask:
    """Validate one request body like vLLM's OpenAI server (the subset routing relies on)."""
    body = _load(raw)
    model = _model(body, names)
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _missing("messages")
    elif not isinstance(body.get("prompt"), str | list):
        raise _missing("prompt")
    n = body.get("n", 1)
    if n != 1:
        raise bad_request(f"n={n!r} is not supported by this server; only n=1.", "n")
    prompt_tokens = estimate_prompt_tokens(body)
    room = max_model_len - prompt_tokens
    if room < 1:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_tokens}.",
            "messages" if chat else "prompt",
        )
    options = body.get("stream_options")
    return Ask(
        body=body,
        chat=chat,
        model=model,
        stream=body.get("stream") is True,
        include_usage=isinstance(options, Mapping) and options.get("include_usage") is True,
        max_tokens=_max_tokens(body, default_max_tokens, room),
        prompt_tokens=prompt_tokens,
    )
