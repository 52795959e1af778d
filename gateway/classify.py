"""Step 3 of a request: classify it into ``Features``. Pure; no I/O, no clock.

Reads the validated request and its headers; produces the values the policy matches on.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import orjson

from gateway import tokens
from gateway.identity import Caller, caller_from
from gateway.schema import AnyRequest, ChatRequest, CompletionRequest
from policies.features import Features, ResponseFormat

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
        model=request.model,
        temperature=defaults.temperature if request.temperature is None else request.temperature,
        top_p=defaults.top_p if request.top_p is None else request.top_p,
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
    )


def prompt_tokens(request: AnyRequest, tool_schemas: bytes = b"") -> int:
    """Estimated prompt tokens; tool definitions count too (chat templates inline them)."""
    if isinstance(request, ChatRequest):
        texts = _message_texts(request)
        if tool_schemas:
            texts = itertools.chain(texts, (tool_schemas.decode(),))
        return tokens.estimate(texts, len(request.messages))
    prompt = request.prompt
    if isinstance(prompt, str):
        return tokens.estimate((prompt,))
    if prompt and isinstance(prompt[0], int):
        return len(prompt)
    if prompt and isinstance(prompt[0], list):
        return max(len(p) for p in prompt if isinstance(p, list))
    return tokens.estimate(p for p in prompt if isinstance(p, str))


def _message_texts(request: ChatRequest) -> Iterator[str]:
    for message in request.messages:
        content = message.content
        if isinstance(content, str):
            yield content
        elif content:
            yield from (str(p["text"]) for p in content if p.get("type") == "text" and "text" in p)


def _tool_names(request: AnyRequest) -> tuple[str, ...]:
    if isinstance(request, CompletionRequest) or not request.tools:
        return ()
    return tuple(tool.function.name for tool in request.tools)


def _tool_schemas(request: AnyRequest) -> bytes:
    """The tool definitions as canonical JSON: what the fingerprint hashes."""
    assert isinstance(request, ChatRequest) and request.tools
    schemas = [tool.model_dump(mode="json") for tool in request.tools]
    return orjson.dumps(schemas, option=orjson.OPT_SORT_KEYS)


def _response_format(request: AnyRequest) -> tuple[ResponseFormat, str]:
    if isinstance(request, CompletionRequest) or request.response_format is None:
        return ResponseFormat.TEXT, ""
    spec = request.response_format
    schema = spec.json_schema.name if spec.json_schema else ""
    return _FORMATS.get(spec.type, ResponseFormat.TEXT), schema
