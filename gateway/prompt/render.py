"""A request's prompt as one canonical sequence of segments, the same for chat,
completions, Messages and Responses carrying the same conversation. Pure.

A segment is ``(role, text)``, in the order the prompt says it: ``system`` (chat's system
and developer messages, Messages' ``system``, Responses' ``instructions`` and its system
and developer items), ``user``, ``assistant``, ``call`` (a tool call: its name and its
arguments as sorted JSON, whether chat's ``tool_calls``, a Messages ``tool_use`` block or a
Responses ``function_call``), ``tool`` (a tool's result: chat's ``tool`` message, a
``tool_result`` block, a ``function_call_output``). The text blocks of one message are
joined with a newline; an image is its data's hash (``[image <hash>]``); reasoning
(``thinking`` blocks, ``reasoning`` items) is left out, as chat templates leave it; ids
(tool call ids, item ids) are left out, since each API spells them its own way. A text
completion's prompt is one ``prompt`` segment. System text loses Claude Code's billing
line (``normalise.strip_billing``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import orjson

from gateway.prompt.normalise import strip_billing
from gateway.schema import (
    AnyRequest,
    ChatRequest,
    CompletionRequest,
    MessagesRequest,
    ResponsesRequest,
)

Segment = tuple[str, str]
_ROLES = {"developer": "system", "function": "tool"}
_SKIPPED = frozenset({"thinking", "redacted_thinking", "reasoning"})
_TEXTS = frozenset({"text", "input_text", "output_text", "refusal"})


def segments(request: AnyRequest) -> Iterator[Segment]:
    """The prompt of ``request``, in order, as far as it is read."""
    for segment in _all(request):
        if segment[1] or segment[0] in ("call", "tool"):
            yield segment


def _all(request: AnyRequest) -> Iterator[Segment]:
    if isinstance(request, ChatRequest):
        for m in request.messages:
            yield from _chat(m.role, m.content, m.model_extra)
    elif isinstance(request, MessagesRequest):
        yield from _system(request.system)
        for message in request.messages:
            yield from _blocks(message.role, message.content)
    elif isinstance(request, ResponsesRequest):
        yield from _system(request.instructions)
        items = [request.input] if isinstance(request.input, str) else request.input
        for item in items:
            yield from _item(item)
    else:
        yield ("prompt", _completion(request))


def _system(system: str | list[dict[str, Any]] | None) -> Iterator[Segment]:
    if system is not None:
        yield from _blocks("system", system)


def _chat(role: str, content: object, extra: dict[str, Any] | None) -> Iterator[Segment]:
    yield from _blocks(role, content)
    calls = (extra or {}).get("tool_calls")
    for call in calls if isinstance(calls, list) else ():  # another type: the engine's 400
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            yield _call(function.get("name"), function.get("arguments"))


def _blocks(role: str, content: object) -> Iterator[Segment]:
    """One message: its text (and image) blocks joined into one segment of its role, its
    tool calls and results as segments of their own, in the order they come."""
    role = _ROLES.get(role, role)
    if isinstance(content, str) or content is None:
        yield _said(role, [content or ""])
        return
    texts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict) or (kind := _kind(block)) in _SKIPPED:
            continue
        if kind == "tool_use":
            yield _said(role, texts)
            texts = []
            yield _call(block.get("name"), block.get("input"))
        elif kind == "tool_result":
            yield _said(role, texts)
            texts = []
            yield ("tool", _text_of(block.get("content")))
        else:
            texts.append(_block_text(block))
    yield _said(role, texts)


def _said(role: str, texts: list[str]) -> Segment:
    text = "\n".join(t for t in texts if t)
    return (role, strip_billing(text) if role == "system" else text)


def _item(item: dict[str, Any] | str) -> Iterator[Segment]:
    """One Responses input item."""
    if isinstance(item, str):
        yield ("user", item)
        return
    kind = _kind(item, "message")
    if kind == "message":
        yield from _blocks(str(item.get("role", "user")), item.get("content"))
    elif kind == "function_call":
        yield _call(item.get("name"), item.get("arguments"))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        yield ("tool", _text_of(item.get("output")))
    elif kind not in _SKIPPED:
        rest = {k: v for k, v in item.items() if k not in ("id", "call_id", "status")}
        yield (str(kind), orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode())


def _call(name: object, arguments: object) -> Segment:
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return ("call", f"{name}({arguments})")
    args = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    return ("call", f"{name}({args})")


def _text_of(content: object) -> str:
    """A tool result's content: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_block_text(b) for b in content if isinstance(b, dict))
    return "" if content is None else orjson.dumps(content).decode()


def _kind(block: dict[str, Any], default: str = "") -> str:
    """A block's or an item's ``type``; anything but a string is no type the prompt reads
    (the engine answers such a request with its own error)."""
    kind = block.get("type", default)
    return kind if isinstance(kind, str) else ""


def _block_text(block: dict[str, Any]) -> str:
    kind = _kind(block)
    text = block.get("text")
    if kind in _TEXTS and isinstance(text, str):
        return text
    if kind in ("image_url", "image", "input_image"):
        return f"[image {_image_hash(block)}]"
    if isinstance(text, str):
        return text
    rest = {k: v for k, v in block.items() if k != "cache_control"}
    return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode()


def _image_hash(block: dict[str, Any]) -> str:
    """The hash of an image's data, whichever API's shape carries it: chat's ``image_url``
    (a URL or a ``data:`` URL), Messages' ``source`` (base64 ``data`` or a ``url``),
    Responses' ``image_url`` string."""
    found = block.get("image_url")
    if isinstance(found, dict):
        found = found.get("url")
    source = block.get("source")
    if isinstance(source, dict):
        found = source.get("data") or source.get("url")
    data = found if isinstance(found, str) else ""
    if data.startswith("data:") and "," in data:
        data = data.split(",", 1)[1]
    return hashlib.blake2b(data.encode(), digest_size=8).hexdigest()


def _completion(request: CompletionRequest) -> str:
    prompt = request.prompt
    if isinstance(prompt, str):
        return prompt
    first = prompt[0] if prompt else ""
    if isinstance(first, str):
        return first
    if isinstance(first, list):
        return ",".join(map(str, first))
    return ",".join(map(str, prompt))
