"""Step 2 of a request: parse and validate the body (the subset of OpenAI's chat,
completions and Responses requests, and of Anthropic's Messages requests, that routing
reads).

Only the fields routing reads are validated; every other field (``tool_choice``,
``logprobs``, vendor extras) is kept and passed upstream untouched (``extra="allow"``).
Bad input raises ``ApiError`` 400 naming the field. A ``stream`` that validation read as a
boolean from another type (``"yes"``, ``1``) is forwarded as that boolean, so that the
upstream streams exactly when routing expects it to; a null ``stream`` (and chat's null
``n``) is read as left out, as vLLM reads it. JSON nested deeper than ``MAX_DEPTH``
levels is refused here, once, with a 400: the gateway writes the payload out again to send it
upstream, and every JSON writer has a depth limit of its own (orjson's is 255). A body sent as
anything but JSON (``json_only``) is refused with a 415, as vLLM refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from gateway.errors import ApiError, bad_request

MAX_DEPTH = 128


def _null_as(default: object) -> BeforeValidator:
    """Reads a JSON null as ``default``, as vLLM reads its optional fields left out."""
    return BeforeValidator(lambda value: default if value is None else value)


Streamed = Annotated[bool, _null_as(False)]  # vLLM's ``stream: bool | None = False``


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: bool | None = None


class FunctionSpec(_Open):
    name: Annotated[str, Field(min_length=1)]


class Tool(_Open):
    type: str = "function"
    function: FunctionSpec


class JsonSchemaSpec(_Open):
    name: str = ""


class ResponseFormatSpec(_Open):
    type: str
    json_schema: JsonSchemaSpec | None = None


class Message(_Open):
    role: Annotated[str, Field(min_length=1)]
    content: str | list[dict[str, Any]] | None = None


class _Sampling(_Open):
    model: Annotated[str, Field(min_length=1)]
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: Streamed = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    n: Annotated[int, _null_as(1), Field(ge=1, le=128)] = 1  # vLLM's ``int | None = 1``
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[Tool] | None = None
    response_format: ResponseFormatSpec | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: Annotated[str, Field(min_length=1)] | list[str] | list[int] | list[list[int]]
    tools: None = None
    response_format: None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens


class AnthropicTool(_Open):
    name: Annotated[str, Field(min_length=1)]
    input_schema: dict[str, Any]


class AnthropicMessage(_Open):
    role: Annotated[str, Field(min_length=1)]
    content: str | list[dict[str, Any]]


class MessagesRequest(_Open):
    """Anthropic's ``POST /v1/messages``: ``max_tokens`` is required, ``system`` is apart
    from ``messages``, tools say ``input_schema``. ``metadata.user_id`` is the user."""

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)]
    system: str | list[dict[str, Any]] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: Streamed = False
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    n: int = 1
    response_format: None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def user(self) -> str | None:
        user = (self.metadata or {}).get("user_id")
        return user if isinstance(user, str) and user else None

    @property
    def include_usage(self) -> bool:
        return True


class ResponsesTool(_Open):
    type: Annotated[str, Field(min_length=1)]
    name: str | None = None


class TextFormat(_Open):
    type: str = "text"
    name: str = ""


class TextSpec(_Open):
    format: TextFormat | None = None


class ResponsesRequest(_Open):
    """OpenAI's ``POST /v1/responses``: ``input`` is a string or a list of items,
    ``instructions`` the system prompt, ``text.format`` the response format, function tools
    are flat (``name``, ``parameters``)."""

    model: Annotated[str, Field(min_length=1)]
    input: (
        Annotated[str, Field(min_length=1)] | Annotated[list[dict[str, Any]], Field(min_length=1)]
    )
    instructions: str | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: Streamed = False
    tools: list[ResponsesTool] | None = None
    text: TextSpec | None = None
    user: str | None = None
    previous_response_id: str | None = None
    n: int = 1
    response_format: None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_output_tokens

    @property
    def include_usage(self) -> bool:
        return True


AnyRequest = ChatRequest | CompletionRequest | MessagesRequest | ResponsesRequest


def json_only(content_type: str) -> None:
    """Refuse (415) a body whose ``content-type`` says it is not JSON, as vLLM does: a
    web page can make a visitor's browser post text or a form to a gateway on their
    network, never JSON, without asking first. A body with no content type is read as
    JSON."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise ApiError(
            status=415,
            message=f"the body must be sent as application/json, not {media[:80]!r}",
            code="unsupported_media_type",
        )


def parse(body: bytes, model: type[AnyRequest]) -> tuple[AnyRequest, dict[str, Any]]:
    """The validated request, by its API's ``model``, and the raw payload (to forward, with
    every unknown field)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise bad_request("the body must be a JSON object")
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and _deeper_than(payload, MAX_DEPTH):
        raise bad_request(f"the body is nested deeper than {MAX_DEPTH} levels")
    try:
        parsed = model.model_validate(payload)
    except ValidationError as exc:
        raise _invalid(exc, payload) from None
    if "stream" in payload and payload["stream"] is not parsed.stream:
        payload["stream"] = parsed.stream  # "yes", 1: upstream streams as routing read it
    return parsed, payload


def _deeper_than(value: object, limit: int) -> bool:
    """Whether JSON ``value`` nests more than ``limit`` arrays and objects (no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        assert isinstance(children, Iterable)
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _invalid(exc: ValidationError, payload: dict[str, Any]) -> Exception:
    """A 400 naming the field as the client wrote it. A field that may be one of several
    types (``input``: a string or a list) is reported for the type it was sent as: of the
    errors of its types, the one that got deepest into the value, else one that is not
    about the value's type, so ``"input": []`` says the list is empty, not that it is no
    string; pydantic's names for the types (``constrained-str``) are left out."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    _, tag = _located(first, payload)
    if tag is not None:  # the alternatives of that field, as pydantic tried them
        alternatives = [
            e for e in errors if len(e["loc"]) > tag and e["loc"][:tag] == first["loc"][:tag]
        ]
        first = min(alternatives, key=lambda e: (-len(_located(e, payload)[0]), _of_type(e)))
    path, _ = _located(first, payload)
    param = ".".join(str(part) for part in path)
    if first["type"] == "missing":
        return bad_request(f"'{param}' is required", param)
    if first["type"] == "extra_forbidden":
        return bad_request(f"'{param}' is not supported here", param)
    return bad_request(f"'{param}': {first['msg']}", param)


def _located(error: ErrorDetails, payload: object) -> tuple[list[str | int], int | None]:
    """An error's place in ``payload`` (keys and indexes), and where in its ``loc`` the first
    name of a type tried stands (None when there is none)."""
    path: list[str | int] = []
    tag: int | None = None
    node, loc = payload, error["loc"]
    for at, part in enumerate(loc):
        inside, child = _child(node, part)
        if inside:
            node = child
        elif not (at == len(loc) - 1 and error["type"] in ("missing", "extra_forbidden")):
            tag = at if tag is None else tag
            continue
        path.append(part)
    return path, tag


def _child(node: object, part: str | int) -> tuple[bool, object]:
    """Whether ``part`` is a key or an index of ``node``, and what it holds there."""
    if isinstance(node, dict) and part in node:
        return True, node[part]
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return True, node[part]
    return False, None


def _of_type(error: ErrorDetails) -> bool:
    """Whether an error only says the value is not of the type tried."""
    return error["type"].endswith(("_type", "_parsing"))
