"""Anthropic's Messages API as vLLM 0.32 serves it (``/v1/messages``,
``/v1/messages/count_tokens``): the request turned into a chat request, and the chat
answer turned back, streamed or whole, as vLLM's own Messages handler does.

So a Messages request runs on the same engine, with the same acceptance and the same steps
as the chat request it becomes: one ``content_block_delta`` event per chat chunk (per
engine step). A stream is ``message_start``, per content block ``content_block_start``,
its deltas (``text_delta``, or ``input_json_delta`` for a tool's input) and
``content_block_stop``, then ``message_delta`` (stop reason, usage) and ``message_stop``,
each as ``event: <type>`` and ``data: <json>``; like vLLM's, it ends there, without a
``[DONE]``. A whole answer has no ``stop_sequence`` (a stream's ``message_start`` and
``message_delta`` have it, null), and a ``count_tokens`` answer is ``input_tokens`` and
``context_management.original_input_tokens``. The answers carry no per-request speculative
metrics, as vLLM's do not. A system block that starts with Claude Code's
``x-anthropic-billing-header`` line is dropped, as vLLM's handler drops it (its per-turn
hash would defeat the prefix cache). What vLLM's request model refuses
(``messages_model.py``: a role of ``robot``, a thinking budget under 1024...) is answered
400 in vLLM's OpenAI shape, as vLLM's validation handler answers it; every other error in
Anthropic's shape with vLLM's type name, as its Messages route translates them:
``{"type": "error", "error": {"type": "NotFoundError", "message": ...}}``.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from backends.sim import messages_model
from backends.sim.protocol import Invalid
from backends.sim.responses import cached_of
from backends.sim.validation import ModelRefused, SimHTTPError, json_object

Json = dict[str, Any]
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# vLLM's type of the errors a Messages stream carries, by their code
_TYPES = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


def error_body(error: SimHTTPError) -> bytes:
    """An error answer of the Messages routes: the request model's refusal as vLLM's
    validation handler writes it, any other in Anthropic's shape with vLLM's type."""
    if isinstance(error, ModelRefused):
        return error.body
    return orjson.dumps({"type": "error", "error": {"type": error.type, "message": error.message}})


def _invalid(message: str) -> SimHTTPError:
    return SimHTTPError(400, message, "BadRequestError")


def chat_request(body: bytes, *, count: bool = False) -> Json:
    """The chat request a Messages request (or, with ``count``, a count_tokens request)
    becomes; ``ModelRefused`` for what vLLM's Messages model refuses, ``SimHTTPError`` 400
    for what its conversion to chat does."""
    payload = json_object(body)
    try:
        messages_model.check(payload, count=count)
    except Invalid as exc:
        raise ModelRefused(400, str(exc), exc.type, exc.param) from None
    model, messages, max_tokens = payload["model"], payload["messages"], payload.get("max_tokens")
    if not messages:
        raise _invalid("messages must contain at least one item")
    chat: Json = {"model": model, "messages": _system(payload.get("system"))}
    for message in messages:
        chat["messages"] += _chat_messages(message)
    for name in ("temperature", "top_p", "top_k"):
        if payload.get(name) is not None:
            chat[name] = payload[name]
    if isinstance(payload.get("stop_sequences"), list):
        chat["stop"] = payload["stop_sequences"]
    if not count:
        chat["max_tokens"] = max_tokens
    tools = payload.get("tools")
    if isinstance(tools, list) and tools:
        chat["tools"] = [_chat_tool(tool) for tool in tools]
        chat["tool_choice"] = _tool_choice(payload.get("tool_choice"))
    if payload.get("stream") is True and not count:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# Claude Code opens its system prompt with a block of this line, whose ``cch`` hash changes
# every turn; vLLM's Messages handler drops such blocks so that the prefix cache holds.
_BILLING = "x-anthropic-billing-header"


def _system(system: object) -> list[Json]:
    if isinstance(system, str) and system:
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        texts = (str(b.get("text") or "") for b in system if isinstance(b, dict))
        text = "".join(t for t in texts if not t.startswith(_BILLING))
        return [{"role": "system", "content": text}] if text else []
    return []


def _chat_messages(message: Json) -> list[Json]:
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not content:
        raise _invalid("message content must not be empty")
    out: list[Json] = []
    texts: list[str] = []
    calls: list[Json] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            function = {"name": block.get("name") or "", "arguments": arguments}
            calls.append({"id": block.get("id") or "", "type": "function", "function": function})
        elif kind == "tool_result":
            result = block.get("content")
            text = result if isinstance(result, str) else orjson.dumps(result).decode()
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
    said: Json = {"role": role, "content": "".join(texts)}
    if calls:
        said["tool_calls"] = calls
    return [said, *out] if texts or calls or not out else out


def _chat_tool(tool: Json) -> Json:
    schema = tool["input_schema"]
    function: Json = {"name": tool["name"], "parameters": {"type": "object"} | schema}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> object:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        assert isinstance(choice, dict)
        return {"type": "function", "function": {"name": choice["name"]}}
    return "auto"


def _event(body: Json) -> bytes:
    return b"event: " + str(body["type"]).encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"


class MessagesStream:
    """A chat stream's chunks (``data:`` events) in, the Messages stream's events out."""

    def __init__(self, prompt_tokens: int, *, cache_read: bool = False) -> None:
        self._prompt = prompt_tokens
        self._cache_read = cache_read
        self._started = False
        self._block: int | None = None  # the open content block's index
        self._blocks = 0
        self._finish = "stop"

    def feed(self, chunk: bytes) -> bytes:
        out = []
        for line in chunk.split(b"\n\n"):
            if line.startswith(b"data: "):
                out.append(self._one(line[6:]))
        return b"".join(out)

    def _one(self, data: bytes) -> bytes:
        if data == b"[DONE]":
            return _event({"type": "message_stop"})
        chunk = orjson.loads(data)
        if "error" in chunk:
            error = chunk["error"]
            kind = _TYPES.get(error.get("code"), "InternalServerError")
            return _event({"type": "error", "error": {"type": kind, "message": error["message"]}})
        out = b"" if self._started else self._start(chunk)
        choices = chunk.get("choices") or []
        if not choices:
            return out + self._end(chunk.get("usage") or {})
        choice = choices[0]
        delta = choice.get("delta") or {}
        if delta.get("content"):
            out += self._open({"type": "text", "text": ""}, None)
            out += self._delta({"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or ():
            arguments = (call.get("function") or {}).get("arguments")
            if call.get("id"):
                name = call["function"].get("name")
                block = {"type": "tool_use", "id": call["id"], "name": name, "input": {}}
                out += self._open(block, call["id"])
            if arguments:
                out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        return out

    def _start(self, chunk: Json) -> bytes:
        self._started = True
        message: Json = {
            "id": chunk.get("id"),
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": chunk.get("model"),
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._prompt, "output_tokens": 0},
        }
        return _event({"type": "message_start", "message": message})

    def _open(self, block: Json, new: str | None) -> bytes:
        """Start ``block`` unless a text block is open and this is text too."""
        if self._block is not None and new is None:
            return b""
        out = self._close()
        self._block = self._blocks
        self._blocks += 1
        start = {"type": "content_block_start", "index": self._block, "content_block": block}
        return out + _event(start)

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        index, self._block = self._block, None
        return _event({"type": "content_block_stop", "index": index})

    def _delta(self, delta: Json) -> bytes:
        return _event({"type": "content_block_delta", "index": self._block, "delta": delta})

    def _end(self, usage: Mapping[str, Any]) -> bytes:
        used = {
            "input_tokens": usage.get("prompt_tokens", self._prompt),
            "output_tokens": usage.get("completion_tokens", 0),
        } | _cache_read(usage, self._cache_read)
        delta = {"stop_reason": _STOP.get(self._finish, "end_turn"), "stop_sequence": None}
        return self._close() + _event({"type": "message_delta", "delta": delta, "usage": used})


def count_body(tokens: int) -> bytes:
    """A ``count_tokens`` answer: the prompt's tokens, before any context management."""
    management = {"original_input_tokens": tokens}
    return orjson.dumps({"input_tokens": tokens, "context_management": management})


def _cache_read(usage: Mapping[str, Any], shown: bool) -> Json:
    """``cache_read_input_tokens`` when ``shown`` and the prompt hit the prefix cache (vLLM
    0.32's Messages handler never sets it; the simulator does with
    ``--enable-prompt-tokens-details``). ``input_tokens`` stays the whole prompt, as in
    vLLM, not Anthropic's uncached remainder."""
    cached = cached_of(usage)
    return {"cache_read_input_tokens": cached} if shown and cached else {}


def whole(chat_body: bytes, *, cache_read: bool = False) -> bytes:
    """A whole chat answer as a whole Messages answer."""
    body = orjson.loads(chat_body)
    choice = body["choices"][0]
    message = choice.get("message") or {}
    content: list[Json] = []
    if message.get("content") or not message.get("tool_calls"):
        content.append({"type": "text", "text": message.get("content") or ""})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}
        block = {"type": "tool_use", "id": call.get("id"), "name": function.get("name")}
        content.append(block | {"input": arguments})
    usage = body.get("usage") or {}
    answer = {
        "id": body.get("id"),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": body.get("model"),
        "stop_reason": _STOP.get(choice.get("finish_reason"), "end_turn"),
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        }
        | _cache_read(usage, cache_read),
    }
    return orjson.dumps(answer)
