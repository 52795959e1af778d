"""Reading one OpenAI request body the way vLLM 0.32 validates it, for the simulated server.

Turns raw bytes into a checked ``Ask`` or raises ``SimHTTPError`` carrying vLLM's status and
error body. The checks run in vLLM's order, each failing the way vLLM fails it:

1. the body: invalid JSON, then vLLM's checks on the raw body (``json_schema`` given, stream
   options only when streaming, ``top_logprobs`` / ``prompt_logprobs``, ``tool_choice``
   against ``tools``), then field types (``backends/sim/protocol.py``): 400;
2. the model: 404; output and prompt length against ``max_model_len``: 400;
3. the sampling parameters (temperature in [0, 2], top_p in (0, 1], penalties, n, max_tokens
   >= 1...): 400;
4. what vLLM checks only once the engine takes the request, after a streamed answer has
   started: more logprobs than ``--max-logprobs``, a JSON schema no grammar backend takes.
   These come back as ``Ask.deferred``: the server answers a stream with one error event
   (status 200 already sent), a whole answer with the 400. A schema that is a ``$ref``
   cycle passes every check and fails the same way as the engine's generation error, 500
   ``InternalServerError`` (``schema_check.never_ends``).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from backends.sim.protocol import (
    ChatRequest,
    CompletionRequest,
    Invalid,
    NamedToolChoice,
    ResponseFormat,
    invalid,
    validated,
)
from backends.sim.responses import error_body
from backends.sim.schema_check import never_ends, schema_problem
from backends.sim.workload import estimate_prompt_tokens


class SimHTTPError(Exception):
    """An error answer of the simulated server, already in vLLM's shape."""

    def __init__(self, status: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, status, param)
        self.message = message
        self.type = type_
        self.param = param

    def event(self) -> bytes:
        """The same error as vLLM puts it in a stream that has started (``json.dumps``)."""
        error = {"message": self.message, "type": self.type, "param": self.param}
        return json_dumps({"error": error | {"code": self.status}})


class ModelRefused(SimHTTPError):
    """What vLLM's request model (pydantic) refuses: answered by its validation handler, in
    its OpenAI shape, on every route, Anthropic's Messages included."""


def json_dumps(value: object) -> bytes:
    """``json.dumps`` as vLLM writes its stream errors: Python's spacing, ASCII escapes."""
    return json.dumps(value).encode()


def json_object(body: bytes) -> dict[str, Any]:
    """A Messages or Responses request body as its JSON object; ``ModelRefused`` for invalid
    JSON or another JSON value, as vLLM's request parsing refuses them on every route."""
    try:
        return _load(body)
    except SimHTTPError as exc:
        raise ModelRefused(exc.status, exc.message, exc.type, exc.param) from None


def bad_request(message: str, param: str | None = None) -> SimHTTPError:
    return SimHTTPError(400, message, "Bad Request", param)


def _rejected(exc: Invalid) -> SimHTTPError:
    return SimHTTPError(400, str(exc), exc.type, exc.param)


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
    deferred: SimHTTPError | None = None
    logprobs: int | None = None  # top logprobs per output token, None when not asked for
    token_ids: bool = False
    prompt_logprobs: int | None = None
    continuous_usage: bool = False
    n: int = 1


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
        message = (
            "1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', "
            "'msg': 'Input should be a valid dictionary or object to extract fields from', "
            f"'input': {_shown(body)!r}}}"
        )
        raise bad_request(message, "body")
    return body


def _shown(value: object) -> str:
    if isinstance(value, list | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)[:200]


def _raw_checks(body: Mapping[str, Any], chat: bool) -> None:
    """vLLM's ``mode="before"`` model validators, which see the body before any typing."""
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and not fmt.get("json_schema"):
        message = "When response_format type is 'json_schema', the 'json_schema' field must be"
        raise invalid(message + " provided.", "response_format")
    if body.get("stream_options") and not body.get("stream"):
        raise invalid("Stream options can only be defined when `stream=True`.", "stream_options")
    counted = ("prompt_logprobs", "top_logprobs") if chat else ("prompt_logprobs", "logprobs")
    for name in counted:
        value = body.get(name)
        if value is not None and not isinstance(value, int | float):
            raise invalid(f"`{name}` must be an integer.", name, value)
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None:
        if body.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            message = "`prompt_logprobs` are not available when `stream=True`."
            raise invalid(message, "prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            message = "`prompt_logprobs` must be a positive value or -1."
            raise invalid(message, "prompt_logprobs", prompt_logprobs)
    if chat:
        _top_logprobs(body)
        _tool_usage(body)
    elif body.get("prompt") in (None, ""):
        raise invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")


def _top_logprobs(body: Mapping[str, Any]) -> None:
    top = body.get("top_logprobs")
    if top is None:
        return
    if top < 0 and top != -1:
        raise invalid("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
    if (top == -1 or top > 0) and not body.get("logprobs"):
        message = "when using `top_logprobs`, `logprobs` must be set to true."
        raise invalid(message, "top_logprobs")


def _tool_usage(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    if tools == []:
        message = "`tools` must not be an empty array. Either provide at least one tool or"
        raise invalid(message + " omit the field entirely.", "tools")
    choice = body.get("tool_choice", "auto" if tools else None)
    if choice in (None, "none"):
        return
    if tools is None:
        raise invalid("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, Mapping):
        message = f"Invalid value for `tool_choice`: {choice}! Only named tools, "
        raise invalid(message + '"none", "auto" or "required" are supported.', "tool_choice")


def _named_tool(request: ChatRequest) -> None:
    choice = request.tool_choice
    if not isinstance(choice, NamedToolChoice):
        return
    names = [tool.function.name for tool in request.tools or ()]
    if choice.function.name not in names:
        message = f"Tool '{choice.function.name}' has not been passed in `tools`."
        raise invalid(message, "tool_choice")


def _model(model: str | None, names: tuple[str, ...]) -> str:
    if model is None:
        return names[0]
    if model not in names:
        message = f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}."
        raise SimHTTPError(404, message, "NotFoundError", "model")
    return model


def _output_limit(
    request: ChatRequest | CompletionRequest, default: int, max_model_len: int
) -> int:
    """The requested output length, checked against the context length as vLLM's
    tokenizer parameters check it; ``default`` when the request names none."""
    name, value = "max_tokens", request.max_tokens
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        name, value = "max_completion_tokens", request.max_completion_tokens
    if value is None:
        return default
    if value > max_model_len:
        message = f"{name}={value} cannot be greater than max_model_len={max_model_len}."
        raise invalid(message + " Please request fewer output tokens.", name, value)
    return value


def _prompt_fits(prompt_tokens: int, max_model_len: int) -> None:
    if prompt_tokens > max_model_len:
        raise invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {prompt_tokens} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            prompt_tokens,
        )


def parse(
    raw: bytes,
    *,
    chat: bool,
    names: tuple[str, ...],
    default_max_tokens: int,
    max_model_len: int,
    max_logprobs: int = 20,
) -> Ask:
    """Validate one request body like vLLM's OpenAI server (see the module docstring)."""
    body = _load(raw)
    try:
        _raw_checks(body, chat)
        request = validated(ChatRequest if chat else CompletionRequest, body)
        if isinstance(request, ChatRequest):
            _named_tool(request)
        model = _model(request.model, names)
        limit = _output_limit(request, default_max_tokens, max_model_len)
        prompt_tokens = estimate_prompt_tokens(body)
        _prompt_fits(prompt_tokens, max_model_len)
        max_tokens = min(limit, max_model_len - prompt_tokens)
        _sampling(request, max_tokens)
        deferred = _engine_checks(request, max_logprobs)
    except Invalid as exc:
        raise _rejected(exc) from None
    options = request.stream_options
    return Ask(
        body=body,
        chat=chat,
        model=model,
        stream=request.stream is True,
        include_usage=bool(options and options.include_usage),
        continuous_usage=bool(options and options.include_usage and options.continuous_usage_stats),
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        deferred=deferred,
        logprobs=_sample_logprobs(request),
        token_ids=bool(request.return_token_ids),
        prompt_logprobs=request.prompt_logprobs,
        n=request.n or 1,
    )


def _sample_logprobs(request: ChatRequest | CompletionRequest) -> int | None:
    """Top logprobs asked per output token (chat: ``top_logprobs`` once ``logprobs``)."""
    if isinstance(request, ChatRequest):
        return (request.top_logprobs or 0) if request.logprobs else None
    return request.logprobs


def _sampling(request: ChatRequest | CompletionRequest, max_tokens: int) -> None:
    """vLLM's ``SamplingParams._verify_args``, for the fields the simulator reads."""
    n: int = request.n if request.n is not None else 1
    if n < 1:
        raise invalid(f"n must be at least 1, got {n}.")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name) or 0.0
        if not -2.0 <= value <= 2.0:
            raise invalid(f"{name} must be in [-2, 2], got {value}.")
    _range(request.temperature, "temperature")
    top_p = 1.0 if request.top_p is None else request.top_p
    if not 0.0 < top_p <= 1.0:
        raise invalid(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    if max_tokens < 1:
        message = f"max_tokens must be at least 1, got {max_tokens}."
        raise invalid(message, "max_tokens", max_tokens)
    if request.min_tokens > max_tokens:
        message = f"min_tokens must be less than or equal to max_tokens={max_tokens}, got"
        raise invalid(f"{message} {request.min_tokens}.")
    stops = [request.stop] if isinstance(request.stop, str) else request.stop or []
    if any(not stop for stop in stops):
        raise invalid("stop cannot contain an empty string.")


def _range(value: float | None, name: str) -> None:
    temperature = 1.0 if value is None else value
    if not math.isfinite(temperature):
        raise invalid(f"{name} must be a finite number, got {temperature}.", name, temperature)
    if temperature < 0.0:
        raise invalid(f"{name} must be non-negative, got {temperature}.", name, temperature)
    if temperature > 2.0:
        raise invalid(f"{name} must be in [0, 2], got {temperature}.", name, temperature)


def _engine_checks(
    request: ChatRequest | CompletionRequest, max_logprobs: int
) -> SimHTTPError | None:
    """What vLLM's engine checks when it takes the request (``SamplingParams.verify``)."""
    sample = _sample_logprobs(request)
    try:
        for kind, count in (("sample", sample), ("prompt", request.prompt_logprobs)):
            if count and count > max_logprobs:
                message = f"Requested {kind} logprobs of {count}, which is greater than max"
                parameter = "logprobs" if kind == "sample" else "prompt_logprobs"
                raise invalid(f"{message} allowed: {max_logprobs}", parameter, count)
        if isinstance(request, ChatRequest):
            _grammar(request)
    except Invalid as exc:
        return _rejected(exc)
    if isinstance(request, ChatRequest) and never_ends(_schema(request)):
        # accepted, then killed at its first token: the engine's generation error
        return SimHTTPError(500, "Internal server error", "InternalServerError")
    return None


def _schema(request: ChatRequest) -> object:
    fmt = request.response_format
    if not isinstance(fmt, ResponseFormat) or fmt.type != "json_schema" or not fmt.json_schema:
        return None
    return fmt.json_schema.json_schema


def _grammar(request: ChatRequest) -> None:
    schema = _schema(request)
    if schema is None:
        return
    problem = schema_problem(schema or {})
    if problem:
        raise invalid(f"Grammar error: {problem}")
