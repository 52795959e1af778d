"""What vLLM 0.32's Messages request model (``/v1/messages``, ``/v1/messages/count_tokens``)
refuses, typed as vLLM types it, for the simulated server.

vLLM parses a Messages body with pydantic before its handler runs, so what the model refuses
is answered by its ``validation_exception_handler``: 400 in vLLM's OpenAI shape
(``{"error": {"message": "1 validation error: ...", "type": "Bad Request", "param":
"body.messages.0.role", "code": 400}}``), not Anthropic's. It refuses: a missing or empty
``model``; ``messages`` missing or not a list of ``{role, content}`` with a role of ``user``,
``assistant`` or ``system`` and content a string or a list of known blocks; ``max_tokens``
missing or under 1 (``/v1/messages`` only); a ``thinking`` of an unknown type, or
``enabled`` with ``budget_tokens`` under 1024 or not under ``max_tokens``; a ``tool_choice``
of an unknown type, or ``tool`` without a name; a tool without a name or an
``input_schema`` object. Every other field is accepted as it comes.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from backends.sim.protocol import validated

_BLOCKS = Literal[
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
]


class _Lax(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Block(_Lax):
    type: _BLOCKS


class _Message(_Lax):
    role: Literal["user", "assistant", "system"]
    content: str | list[_Block]


class _Tool(_Lax):
    name: str
    input_schema: dict[str, Any]


class _ToolChoice(_Lax):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None

    @model_validator(mode="after")
    def _named(self) -> _ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


class _Enabled(_Lax):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)


class _Disabled(_Lax):
    type: Literal["disabled"]


class _Adaptive(_Lax):
    type: Literal["adaptive"]


_Thinking = Annotated[_Enabled | _Disabled | _Adaptive, Field(discriminator="type")]


class CountRequest(_Lax):
    """``/v1/messages/count_tokens``."""

    model: str
    messages: list[_Message]
    system: str | list[_Block] | None = None
    thinking: _Thinking | None = None
    tool_choice: _ToolChoice | None = None
    tools: list[_Tool] | None = None

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value:
            raise ValueError("Model is required")
        return value


class MessagesRequest(CountRequest):
    """``/v1/messages``."""

    max_tokens: int
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    stop_sequences: list[str] | None = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("max_tokens must be positive")
        return value

    @model_validator(mode="after")
    def _budget(self) -> MessagesRequest:
        thinking = self.thinking
        if isinstance(thinking, _Enabled) and thinking.budget_tokens >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


def check(payload: dict[str, Any], *, count: bool) -> None:
    """``Invalid`` (vLLM's rendering, type ``Bad Request``) for what vLLM's model refuses."""
    validated(CountRequest if count else MessagesRequest, payload)
