"""The request fields a simulated vLLM checks, typed as vLLM 0.32 types them, and vLLM's
rendering of a failed check.

vLLM parses a request body with pydantic (lax mode: ``"0.5"`` is a number, ``"hot"`` is
not) and answers a type error 400 with every error listed the way its
``validation_exception_handler`` lists them (``N validation error(s):`` then one dict per
error, internal union markers dropped from ``loc``, long inputs summarised). A check in vLLM's
own code raises ``VLLMValidationError`` instead, rendered as ``message (parameter=..,
value=..)`` with type ``BadRequestError`` and that parameter as ``param``. Only the common
fields are modelled; every other field is accepted as it comes.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)

_INT64 = 2**63
_MAX_REPORTED = 10
_MAX_INPUT_CHARS = 200
_MAX_ERROR_CHARS = 1000
_BRACKETED = re.compile(r"[\[\]{}()]")
# pydantic's schema-kind words that vLLM drops from ``loc`` (union branches, wrappers)
_INTERNAL_WORDS = """
function-wrap function-after function-before function-plain json-or-python lax-or-strict
chain default nullable tagged-union union call arguments is-instance is-subclass callable
str int float bool bytes bytearray list tuple dict set frozenset complex none nonetype
"""
_INTERNAL = frozenset(_INTERNAL_WORDS.split())


class _Open(BaseModel):
    """Extra fields allowed. The wrap validator is what vLLM's base model has: it makes
    pydantic name a union member ``function-wrap[...]`` in ``loc``, which is then dropped,
    instead of by its class name."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="wrap")
    @classmethod
    def _as_vllm(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        return handler(data)


class StreamOptions(_Open):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class JsonSchema(_Open):
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StructuralTagFormat(_Open):
    type: Literal["structural_tag"]
    format: Any


class LegacyStructuralTagFormat(_Open):
    type: Literal["structural_tag"]
    structures: list[dict[str, Any]]
    triggers: list[str]


# vLLM's AnyResponseFormat: a body that fits none is reported against all three
AnyResponseFormat = ResponseFormat | StructuralTagFormat | LegacyStructuralTagFormat


class Function(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: Function


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    function: NamedFunction
    type: Literal["function"] = "function"


Stop = str | Annotated[list[str], Field(max_length=64)] | None
Seed = Annotated[int, Field(ge=-_INT64, le=_INT64 - 1)] | None


class _Sampling(_Open):
    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: Seed = None
    stop: Stop = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    prompt_logprobs: int | None = None
    return_token_ids: bool | None = None
    echo: bool | None = False


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    response_format: AnyResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = "none"


PromptIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(_Sampling):
    prompt: PromptIds | list[PromptIds] | str | list[str] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    best_of: int | None = None
    suffix: str | None = None


class Invalid(Exception):
    """A request vLLM would answer 400: ``message`` and ``param`` as vLLM renders them."""

    def __init__(self, message: str, param: str | None, type_: str = "BadRequestError") -> None:
        super().__init__(message)
        self.param = param
        self.type = type_


def invalid(message: str, parameter: str | None = None, value: object = None) -> Invalid:
    """vLLM's ``VLLMValidationError``: the parameter and value appended to the message."""
    extras = [f"parameter={parameter}"] if parameter is not None else []
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return Invalid(text, parameter)


def validated(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """``body`` as ``model``, or ``Invalid`` with vLLM's rendering of every type error."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors: list[dict[str, Any]] = [
            {**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)
        ]
        first: tuple[object, ...] = errors[0]["loc"]
        raise Invalid(render(errors), clean_loc(first), "Bad Request") from None


def render(errors: list[dict[str, Any]]) -> str:
    count = len(errors)
    label = "error" if count == 1 else "errors"
    lines = [f"{count} validation {label}:"]
    lines += [f"  {_format(e)}" for e in errors[:_MAX_REPORTED]]
    if count > _MAX_REPORTED:
        lines.append(f"  ...and {count - _MAX_REPORTED} more {label}")
    return "\n".join(lines)


def clean_loc(loc: Iterable[object]) -> str:
    """A pydantic ``loc`` as a dotted path, without pydantic's internal segments."""
    parts = [str(p) for p in loc]
    kept = [p for p in parts if not (_BRACKETED.search(p) or p.lower() in _INTERNAL)]
    return ".".join(kept or parts)


def _format(error: dict[str, Any]) -> str:
    shown = dict(error)
    if "input" in shown:
        shown["input"] = _summary(shown["input"])
    shown["loc"] = clean_loc(shown["loc"])
    text = str(shown)
    return text[:_MAX_ERROR_CHARS] + "...[truncated]" if len(text) > _MAX_ERROR_CHARS else text


def _summary(value: object) -> object:
    if isinstance(value, str):
        return value[:_MAX_INPUT_CHARS] + "...[truncated]" if len(value) > 200 else value
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text[:_MAX_INPUT_CHARS] + "...[truncated]" if len(text) > 200 else text
