"""Step 3 of a request: classify it into ``Features``. Pure; no I/O, no clock.

Reads the validated request and its headers; produces the values the policy matches on.
Every API is read into the same values: a tool offered by Anthropic's Messages
(``input_schema``) or OpenAI's Responses (flat ``name``/``parameters``) is fingerprinted as
the same tool offered by chat (``function.parameters``), so one tool schema is one slice
whichever door it comes in by; a Messages ``system`` and a Responses ``instructions`` count
in the context length as a chat system message does.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

import orjson

from gateway import tokens
from gateway.apis import api_of
from gateway.identity import Caller, caller_from
from gateway.prompt.prints import prints
from gateway.prompt.render import segments
from gateway.schema import (
    AnyRequest,
    ChatRequest,
    CompletionRequest,
    MessagesRequest,
    ResponsesRequest,
)
from policies.features import Features, ResponseFormat
from policies.model import RequestDefaults

_FORMATS = {f.value: f for f in ResponseFormat}


@dataclass(frozen=True, slots=True)
class Defaults:
    """What the backends use when a request leaves a sampling field out, and the headers
    classification reads. ``tenant_header`` names the tenant only for operator tools
    (``policy explain``, the console): a served request's caller comes from
    ``gateway/identity.py``."""

    temperature: float = 1.0
    top_p: float = 1.0
    tenant_header: str = "x-speclane-tenant"
    endpoint_header: str = "x-speclane-endpoint"

    def under(self, policy: RequestDefaults) -> Defaults:
        """These defaults with what the policy file says the served model uses on top."""
        if policy.temperature is None and policy.top_p is None:
            return self
        return replace(
            self,
            temperature=self.temperature if policy.temperature is None else policy.temperature,
            top_p=self.top_p if policy.top_p is None else policy.top_p,
        )


def classify(
    request: AnyRequest,
    path: str,
    headers: Mapping[str, str],
    request_id: str,
    defaults: Defaults,
    caller: Caller | None = None,
) -> Features:
    """``caller`` is who the gateway found the request comes from; without it (operator
    tools) the tenant header is believed."""
    caller = caller or caller_from(headers, defaults.tenant_header, {})
    tenant = caller.tenant
    tools = _tool_names(request)
    schemas = _tool_schemas(request) if tools else b""
    fmt, schema = _response_format(request)
    return Features(
        endpoint=headers.get(defaults.endpoint_header) or path,
        api=api_of(path),
        model=request.model,
        temperature=defaults.temperature if request.temperature is None else request.temperature,
        top_p=defaults.top_p if request.top_p is None else request.top_p,
        defaulted=_defaulted(request),
        tools=tools,
        tools_fingerprint=hashlib.blake2b(schemas, digest_size=8).hexdigest() if tools else "",
        response_format=fmt,
        schema_name=schema,
        prompt_tokens=prompt_tokens(request, schemas),
        max_tokens=request.output_limit,
        stream=request.stream,
        n=request.n,
        tenant=tenant,
        routing_key=caller.sticky,
        user=request.user or "",
        request_id=request_id,
        headers=headers,
        thinking=_thinks(request),
        prompt=prints(segments(request)),
    )


def _defaulted(request: AnyRequest) -> tuple[str, ...]:
    """The sampling fields the request left out, which the backend's defaults fill."""
    if request.temperature is None:
        return ("temperature",) if request.top_p is not None else ("temperature", "top_p")
    return () if request.top_p is not None else ("top_p",)


def prompt_tokens(request: AnyRequest, tool_schemas: bytes = b"") -> int:
    """Estimated prompt tokens; tool definitions count too (chat templates inline them)."""
    if not isinstance(request, CompletionRequest):
        texts, messages = _texts(request)
        if tool_schemas:
            texts = itertools.chain(texts, (tool_schemas.decode(),))
        return tokens.estimate(texts, messages)
    prompt = request.prompt
    if isinstance(prompt, str):
        return tokens.estimate((prompt,))
    if prompt and isinstance(prompt[0], int):
        return len(prompt)
    if prompt and isinstance(prompt[0], list):
        return max(len(p) for p in prompt if isinstance(p, list))
    return tokens.estimate(p for p in prompt if isinstance(p, str))


def _texts(
    request: ChatRequest | MessagesRequest | ResponsesRequest,
) -> tuple[Iterator[str], int]:
    """The prompt's texts and how many messages hold them."""
    if isinstance(request, ChatRequest):
        return _parts([m.content for m in request.messages]), len(request.messages)
    if isinstance(request, MessagesRequest):
        system: list[object] = [] if request.system is None else [request.system]
        contents = itertools.chain(system, (m.content for m in request.messages))
        return _parts(contents), len(system) + len(request.messages)
    items = [request.input] if isinstance(request.input, str) else request.input
    told: list[object] = [] if request.instructions is None else [request.instructions]
    said = itertools.chain(told, (_item_content(i) for i in items))
    return _parts(said), len(told) + len(items)


def _item_content(item: object) -> object:
    """What a Responses input item says: a message's content, a tool result's output."""
    if isinstance(item, str) or not isinstance(item, dict):
        return item
    if "content" in item:
        return item["content"]
    return item.get("output") or item.get("arguments")


def _parts(contents: Iterable[object]) -> Iterator[str]:
    """The text of each message content: a string, or the text parts of a list (chat's
    ``text``, Anthropic's ``text`` and ``tool_result``, Responses' ``input_text``)."""
    for content in contents:
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    yield from _part_text(part)


def _part_text(part: dict[str, object]) -> Iterator[str]:
    text = part.get("text")
    if isinstance(text, str):
        yield text
    inner = part.get("content")
    if isinstance(inner, str):  # a tool result's output
        yield inner
    elif isinstance(inner, list):
        yield from _parts((inner,))
    if part.get("type") == "tool_use" and "input" in part:
        yield orjson.dumps(part["input"]).decode()


def _tool_names(request: AnyRequest) -> tuple[str, ...]:
    if isinstance(request, CompletionRequest) or not request.tools:
        return ()
    if isinstance(request, ChatRequest):
        return tuple(tool.function.name for tool in request.tools)
    if isinstance(request, MessagesRequest):
        return tuple(tool.name for tool in request.tools)
    return tuple(tool.name or tool.type for tool in request.tools)


def _tool_schemas(request: AnyRequest) -> bytes:
    """The tool definitions as canonical JSON, in chat's shape whatever the API: what the
    fingerprint hashes."""
    assert not isinstance(request, CompletionRequest) and request.tools
    if isinstance(request, ChatRequest):
        schemas = [tool.model_dump(mode="json") for tool in request.tools]
    elif isinstance(request, MessagesRequest):
        schemas = [
            _as_chat_tool(tool.name, tool.model_extra, tool.input_schema) for tool in request.tools
        ]
    else:
        schemas = [_responses_tool(tool.model_dump(mode="json")) for tool in request.tools]
    return orjson.dumps(schemas, option=orjson.OPT_SORT_KEYS)


def _as_chat_tool(
    name: str, extra: dict[str, object] | None, parameters: object
) -> dict[str, object]:
    function: dict[str, object] = {"name": name, "parameters": parameters}
    for key in ("description", "strict"):
        if extra and extra.get(key) is not None:
            function[key] = extra[key]
    return {"type": "function", "function": function}


def _responses_tool(tool: dict[str, object]) -> dict[str, object]:
    """A Responses function tool (flat) in chat's shape; a built-in tool as it came."""
    name = tool.get("name")
    if tool.get("type") != "function" or not isinstance(name, str):
        return {k: v for k, v in tool.items() if v is not None}
    return _as_chat_tool(name, tool, tool.get("parameters"))


def _response_format(request: AnyRequest) -> tuple[ResponseFormat, str]:
    if isinstance(request, ResponsesRequest):
        spec = request.text.format if request.text else None
        if spec is None:
            return ResponseFormat.TEXT, ""
        return _FORMATS.get(spec.type, ResponseFormat.TEXT), spec.name
    if not isinstance(request, ChatRequest) or request.response_format is None:
        return ResponseFormat.TEXT, ""
    asked = request.response_format
    schema = asked.json_schema.name if asked.json_schema else ""
    return _FORMATS.get(asked.type, ResponseFormat.TEXT), schema


def _thinks(request: AnyRequest) -> bool:
    """Whether the request asks for reasoning before the answer: Anthropic's ``thinking``,
    OpenAI's ``reasoning`` (Responses) or ``reasoning_effort`` (chat)."""
    if isinstance(request, MessagesRequest):
        return bool(request.thinking) and (request.thinking or {}).get("type") != "disabled"
    extra = request.model_extra or {}
    return bool(extra.get("reasoning") or extra.get("reasoning_effort"))
