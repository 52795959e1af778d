"""What kind of work one request body asks the simulated engine for.

The simulator's acceptance depends on the workload the way the literature reports it, so the
first thing it does with a request is read it: which workload it is, about how many prompt
tokens it has, and whether it must answer with a tool call.

Precedence (first match wins):

1. ``json`` - ``response_format.type`` is ``json_object`` or ``json_schema``;
2. ``tools`` - a non-empty ``tools`` list;
3. ``code`` - the prompt looks like code or asks for it (fences, ``def``, ``class X``,
   ``import x``, the words function / code / python / javascript / sql ...);
4. ``summarise`` - estimated prompt tokens at or above the long-context threshold, or
   "summar" in the prompt;
5. ``creative`` - temperature >= 0.9 (absent temperature counts as the default, 1.0 like
   vLLM and OpenAI; ``sampled`` first fills in the model's own, where it has one);
6. ``chat`` - everything else.

Pure: no I/O, no clock, no randomness. Bodies are read, never modified.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

CREATIVE_TEMPERATURE = 0.9
DEFAULT_TEMPERATURE = 1.0
LONG_CONTEXT_TOKENS = 8000
CHARS_PER_TOKEN = 4
_TOKENS_PER_MESSAGE = 4
# Marker search looks at both ends of long prompts only: a 100k-character document should not
# cost a regex scan on every request, and instructions sit at the start or the end.
_MARKER_WINDOW = 4000

_CODE = re.compile(
    r"```|\bdef \w|\bclass \w|\bimport \w|\bfunction\b|\bcode\b|\bpython\b|\bjavascript\b"
    r"|\btypescript\b|\bsql\b|\brust\b|\bgolang\b|\bbash\b|\bcompile",
    re.IGNORECASE,
)
_SUMMARY = re.compile(r"summar", re.IGNORECASE)


class Workload(StrEnum):
    """The request kinds the simulator tells apart; each has its own draft acceptance."""

    JSON = "json"
    TOOLS = "tools"
    CODE = "code"
    SUMMARISE = "summarise"
    CREATIVE = "creative"
    CHAT = "chat"


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text") for p in content if isinstance(p, Mapping))
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def prompt_text(body: Mapping[str, object]) -> str:
    """The prompt's text: every message's text joined, or the completions ``prompt``."""
    messages = body.get("messages")
    if isinstance(messages, list):
        texts = (_content_text(m.get("content")) for m in messages if isinstance(m, Mapping))
        return "\n".join(texts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def estimate_prompt_tokens(body: Mapping[str, object], text: str | None = None) -> int:
    """About four characters per token, plus a few tokens of chat template per message.

    A completions prompt given as token ids counts its ids.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if text is None:
        text = prompt_text(body)
    messages = body.get("messages")
    overhead = _TOKENS_PER_MESSAGE * len(messages) if isinstance(messages, list) else 0
    return max(1, len(text) // CHARS_PER_TOKEN + overhead)


def temperature_of(body: Mapping[str, object]) -> float:
    """The request's temperature, or the server default (1.0) when absent or malformed."""
    value = body.get("temperature")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return DEFAULT_TEMPERATURE


def sampled(body: Mapping[str, object], temperature: float | None) -> Mapping[str, object]:
    """The body as the engine samples it: without a temperature, the model's default
    (``temperature``, from its generation_config.json; None: the server's 1.0)."""
    if temperature is None or body.get("temperature") is not None:
        return body
    return {**body, "temperature": temperature}


def _response_format_is_json(body: Mapping[str, object]) -> bool:
    fmt = body.get("response_format")
    return isinstance(fmt, Mapping) and fmt.get("type") in ("json_object", "json_schema")


def _markers(text: str) -> str:
    if len(text) <= 2 * _MARKER_WINDOW:
        return text
    return text[:_MARKER_WINDOW] + "\n" + text[-_MARKER_WINDOW:]


def classify(
    body: Mapping[str, object],
    *,
    long_context_tokens: int = LONG_CONTEXT_TOKENS,
    text: str | None = None,
    prompt_tokens: int | None = None,
) -> Workload:
    """The workload of one request body (precedence in the module docstring).

    ``text`` and ``prompt_tokens`` may be passed when the caller has them already.
    """
    if _response_format_is_json(body):
        return Workload.JSON
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        return Workload.TOOLS
    if text is None:
        text = prompt_text(body)
    markers = _markers(text)
    if _CODE.search(markers):
        return Workload.CODE
    if prompt_tokens is None:
        prompt_tokens = estimate_prompt_tokens(body, text)
    if prompt_tokens >= long_context_tokens or _SUMMARY.search(markers):
        return Workload.SUMMARISE
    if temperature_of(body) >= CREATIVE_TEMPERATURE:
        return Workload.CREATIVE
    return Workload.CHAT


def forced_tool_name(body: Mapping[str, object]) -> str | None:
    """The function the answer must call, when ``tool_choice`` requires one.

    ``"required"`` picks the first tool; ``{"type": "function", "function": {"name": ...}}``
    picks that one. ``"auto"``, ``"none"`` or no ``tool_choice`` answer with text.
    """
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        return name if isinstance(name, str) and name else None
    if choice != "required":
        return None
    first = tools[0]
    function = first.get("function") if isinstance(first, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    return name if isinstance(name, str) and name else "tool"


def tool_names(body: Mapping[str, object]) -> tuple[str, ...]:
    """The names of the functions a request offers, in order."""
    tools = body.get("tools")
    names = []
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            names.append(name)
    return tuple(names)


def schema_properties(body: Mapping[str, object]) -> Mapping[str, object]:
    """The ``properties`` of a ``json_schema`` response format's schema, or an empty mapping."""
    fmt = body.get("response_format")
    spec = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return props if isinstance(props, Mapping) else {}


def tool_parameters(body: Mapping[str, object], name: str) -> Mapping[str, object]:
    """The JSON-schema ``properties`` of the named tool, or an empty mapping."""
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            params = function.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            return props if isinstance(props, Mapping) else {}
    return {}
