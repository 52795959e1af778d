"""OpenAI's Responses API as vLLM 0.32 serves it (``/v1/responses``): the request turned
into a chat request, and the chat answer turned back, streamed or whole.

So a Responses request runs on the same engine, with the same acceptance and the same
steps as the chat request it becomes: one delta event per chat chunk (per engine step). A
stream is ``response.created`` and ``response.in_progress``; per output item
``response.output_item.added``, then for text ``response.content_part.added``,
``response.output_text.delta`` events, ``response.output_text.done`` and
``response.content_part.done``, for a tool call ``response.function_call_arguments.delta``
events and ``.done``; ``response.output_item.done``; and ``response.completed`` with the
whole response and its usage (also for an answer cut at ``max_output_tokens``: its
``status`` inside is then ``incomplete``), each as ``event: <type>`` and ``data: <json>``
with a rising ``sequence_number``, and no ``[DONE]``. The response object has every field
vLLM 0.32's has, most of them echoes of the request or null (``text`` is null unless a
format was asked for; a named function ``tool_choice`` shows as the ``json_schema`` format
its arguments were held to), usage with its ``*_per_turn`` lists, and no ``error``; output
items carry ``phase``, text parts ``logprobs``, function calls ``async``, ``caller`` and
``namespace``. The answers carry no per-request speculative metrics, as vLLM's do not: a
finished response's ``metrics``, where the chat answer has any, are its timings with
``speculative_decoding`` null.

Like vLLM, the server keeps the responses it made, so a request naming
``previous_response_id`` continues that conversation (``Histories``), and one naming an id
this server does not hold is answered 404 (the bodies themselves, for
``GET /v1/responses/{id}``, are ``backends/sim/stored.py``'s). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from backends.sim.responses import TIMING_FIELDS, cached_of
from backends.sim.validation import SimHTTPError, json_object

Json = dict[str, Any]
_KEEP = 4096  # stored responses a server keeps, the oldest dropped first


def _invalid(message: str, param: str | None = None) -> SimHTTPError:
    return SimHTTPError(400, message, "invalid_request_error", param)


class Histories:
    """The conversations behind the responses one server made: id -> chat messages."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, list[Json]] = OrderedDict()

    def keep(self, response_id: str, messages: list[Json]) -> None:
        self._kept[response_id] = messages
        while len(self._kept) > _KEEP:
            self._kept.popitem(last=False)

    def history(self, response_id: str) -> list[Json]:
        found = self._kept.get(response_id)
        if found is None:
            message = f"Response with id '{response_id}' not found."
            raise SimHTTPError(404, message, "invalid_request_error", "previous_response_id")
        return list(found)


def chat_request(body: bytes, stored: Histories) -> Json:
    """The chat request a Responses request becomes; ``SimHTTPError`` 400 for a body vLLM
    refuses, 404 for a ``previous_response_id`` it does not hold."""
    payload = json_object(body)
    model, given = payload.get("model"), payload.get("input")
    if not isinstance(model, str) or not model:
        raise _invalid("model: Field required", "model")
    if not isinstance(given, str | list) or not given:
        raise _invalid("input: Field required", "input")
    previous = payload.get("previous_response_id")
    messages = stored.history(previous) if isinstance(previous, str) else []
    if isinstance(payload.get("instructions"), str):
        messages = [m for m in messages if m["role"] != "system"]
        messages.insert(0, {"role": "system", "content": payload["instructions"]})
    messages += _chat_messages(given)
    chat: Json = {"model": model, "messages": messages}
    for name in ("temperature", "top_p"):
        if payload.get(name) is not None:
            chat[name] = payload[name]
    if isinstance(payload.get("max_output_tokens"), int):
        chat["max_tokens"] = payload["max_output_tokens"]
    tools = [_chat_tool(t) for t in payload.get("tools") or () if _function(t)]
    if tools:
        chat["tools"] = tools
        chat["tool_choice"] = _tool_choice(payload.get("tool_choice"))
    fmt = (
        (payload.get("text") or {}).get("format") if isinstance(payload.get("text"), dict) else None
    )
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        chat["response_format"] = _response_format(fmt)
    if payload.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _function(tool: object) -> bool:
    return isinstance(tool, dict) and tool.get("type") == "function"


def _chat_messages(given: str | list[Any]) -> list[Json]:
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    out: list[Json] = []
    for item in given:
        if not isinstance(item, dict):
            raise _invalid("input: each item must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role", "user"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
            call = {"id": item.get("call_id"), "type": "function", "function": function}
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")}
            )
    return out


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _chat_tool(tool: Mapping[str, Any]) -> Json:
    if not isinstance(tool.get("name"), str):
        raise _invalid("tools: a function tool needs a name", "tools")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> object:
    if choice in ("none", "required", "auto"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return "auto"


def _response_format(fmt: Mapping[str, Any]) -> Json:
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def _usage(prompt: int, completion: int, cached: int = 0) -> Json:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": cached,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + completion,
    }


def metrics(chat_metrics: object) -> Json | None:
    """A response's ``metrics``: the chat answer's timings, when it has any, and
    ``speculative_decoding`` null, as vLLM's Responses answers have it."""
    if not isinstance(chat_metrics, dict):
        return None
    timings = {name: chat_metrics.get(name) for name in TIMING_FIELDS}
    return timings | {"speculative_decoding": None}


def _echoed_tool(tool: object) -> object:
    """A request's tool as vLLM echoes it: a function tool with every field it knows."""
    if not _function(tool):
        return tool
    assert isinstance(tool, dict)
    return {
        "name": tool.get("name"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
        "type": "function",
        "allowed_callers": None,
        "async": None,
        "defer_loading": None,
        "description": tool.get("description"),
        "output_schema": None,
    }


def _text_config(request: Mapping[str, Any]) -> Json | None:
    """The response's ``text``: null when the request gave no format; a named function
    ``tool_choice`` is the format its arguments were constrained to, as vLLM does it."""
    choice = request.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        named = [t for t in request.get("tools") or () if _function(t)]
        schema = next(
            (t.get("parameters") for t in named if t.get("name") == choice.get("name")), None
        )
        spec = {"name": "tool_calling_response", "schema": schema, "type": "json_schema"}
        return {"format": spec | {"description": None, "strict": True}, "verbosity": None}
    text = request.get("text")
    if not isinstance(text, dict):
        return None
    fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt = {k: fmt.get(k) for k in ("name", "schema", "type", "description", "strict")}
    elif isinstance(fmt, dict):
        fmt = {"type": fmt.get("type")}
    return {"format": fmt, "verbosity": text.get("verbosity")}


def response(
    response_id: str,
    request: Mapping[str, Any],
    created: int,
    output: list[Json],
    usage: Json | None,
    status: str,
    timings: Json | None = None,
) -> Json:
    """The response object: of ``response.created`` (in progress, no output), of
    ``response.completed``, or the whole answer; ``timings`` is its ``metrics``, left out
    when null, as vLLM leaves it."""
    tools = [_echoed_tool(t) for t in request.get("tools") or ()]
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    body: Json = {
        "id": response_id,
        "created_at": created,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "metadata": request.get("metadata"),
        "model": request.get("model"),
        "object": "response",
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature", 1.0),
        "tool_choice": request.get("tool_choice", "auto" if tools else "none"),
        "tools": tools,
        "top_p": request.get("top_p", 1.0),
        "background": bool(request.get("background", False)),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"),
        "previous_response_id": request.get("previous_response_id"),
        "prompt": request.get("prompt"),
        "reasoning": request.get("reasoning"),
        "service_tier": request.get("service_tier", "auto"),
        "status": status,
        "text": _text_config(request),
        "top_logprobs": request.get("top_logprobs"),
        "truncation": request.get("truncation", "disabled"),
        "usage": usage,
        "user": request.get("user"),
    }
    if timings is not None:
        body["metrics"] = timings
    return body | {
        "presence_penalty": request.get("presence_penalty", 0.0),
        "frequency_penalty": request.get("frequency_penalty", 0.0),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _part(text: str, logprobs: list[Any] | None) -> Json:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _message(item_id: str, status: str, content: list[Json]) -> Json:
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def _function_call(item_id: str, call: Mapping[str, Any], arguments: str, status: str) -> Json:
    function = call.get("function") or {}
    return {
        "arguments": arguments,
        "call_id": call.get("id"),
        "name": function.get("name"),
        "type": "function_call",
        "id": item_id,
        "async": None,
        "caller": None,
        "namespace": None,
        "status": status,
    }


def output_items(response_id: str, message: Mapping[str, Any]) -> list[Json]:
    """A chat answer's message as Responses output items."""
    suffix = response_id.removeprefix("resp_")
    items: list[Json] = []
    if message.get("content") or not message.get("tool_calls"):
        part = _part(message.get("content") or "", None)
        items.append(_message("msg_" + suffix, "completed", [part]))
    for call in message.get("tool_calls") or ():
        arguments = (call.get("function") or {}).get("arguments") or ""
        items.append(_function_call("fc_" + suffix, call, arguments, "completed"))
    return items


def whole(chat_body: bytes, response_id: str, request: Mapping[str, Any], created: int) -> Json:
    """A whole chat answer as a whole Responses answer."""
    body = orjson.loads(chat_body)
    choice = body["choices"][0]
    usage = body.get("usage") or {}
    used = _usage(
        usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), cached_of(usage)
    )
    output = output_items(response_id, choice.get("message") or {})
    status = _status(choice.get("finish_reason"))
    return response(
        response_id, request, created, output, used, status, metrics(body.get("metrics"))
    )


class ResponsesStream:
    """A chat stream's chunks (``data:`` events) in, the Responses stream's events out; at
    its end, ``message`` is the chat message the answer was (what ``Stored`` keeps)."""

    def __init__(self, response_id: str, request: Mapping[str, Any], created: int) -> None:
        self.response_id = response_id
        self._id = response_id
        self._request = request
        self._created = created
        self._sequence = 0
        self._text: list[str] | None = None  # the open message item's text
        self._call: Json | None = None  # the open function call item
        self._items: list[Json] = []
        self._finish: str | None = None
        self.message: Json = {"role": "assistant", "content": ""}
        self.final: Json | None = None  # the whole response, once completed

    def _event(self, body: Json) -> bytes:
        kind = str(body["type"])
        body = {"type": kind, "sequence_number": self._sequence} | body
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    def feed(self, chunk: bytes) -> bytes:
        out = []
        for line in chunk.split(b"\n\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                out.append(self._one(orjson.loads(line[6:])))
        return b"".join(out)

    def _one(self, chunk: Json) -> bytes:
        if "error" in chunk:
            error = chunk["error"]
            return self._event(
                {"type": "error", "code": error.get("code"), "message": error.get("message")}
            )
        out = b""
        if self._sequence == 0:
            started = response(self._id, self._request, self._created, [], None, "in_progress")
            out += self._event({"type": "response.created", "response": started})
            out += self._event({"type": "response.in_progress", "response": started})
        choices = chunk.get("choices") or []
        if not choices:
            return out + self._completed(chunk.get("usage") or {}, metrics(chunk.get("metrics")))
        delta = choices[0].get("delta") or {}
        if delta.get("content"):
            out += self._text_delta(delta["content"])
        for call in delta.get("tool_calls") or ():
            out += self._call_delta(call)
        self._finish = choices[0].get("finish_reason") or self._finish
        return out

    def _index(self) -> int:
        return len(self._items)

    def _text_delta(self, text: str) -> bytes:
        out = b""
        item_id = "msg_" + self._id.removeprefix("resp_")
        if self._text is None:
            out += self._close()
            self._text = []
            item = _message(item_id, "in_progress", [])
            out += self._event(
                {"type": "response.output_item.added", "output_index": self._index(), "item": item}
            )
            part = _part("", [])
            out += self._event(
                {
                    "type": "response.content_part.added",
                    "item_id": item_id,
                    "output_index": self._index(),
                    "content_index": 0,
                    "part": part,
                }
            )
        self._text.append(text)
        return out + self._event(
            {
                "type": "response.output_text.delta",
                "item_id": item_id,
                "output_index": self._index(),
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            }
        )

    def _call_delta(self, call: Json) -> bytes:
        out = b""
        function = call.get("function") or {}
        if call.get("id"):
            out += self._close()
            item_id = "fc_" + self._id.removeprefix("resp_")
            self._call = _function_call(item_id, call, "", "in_progress")
            added = {"type": "response.output_item.added", "output_index": self._index()}
            out += self._event(added | {"item": dict(self._call)})
        arguments = function.get("arguments")
        if arguments and self._call is not None:
            self._call["arguments"] += arguments
            out += self._event(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": self._call["id"],
                    "output_index": self._index(),
                    "delta": arguments,
                }
            )
        return out

    def _close(self) -> bytes:
        """End the open output item, if any."""
        out = b""
        index = self._index()
        if self._text is not None:
            text, self._text = "".join(self._text), None
            item_id = "msg_" + self._id.removeprefix("resp_")
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            done_text = {"type": "response.output_text.done", "text": text, "logprobs": []}
            out += self._event(done_text | where)
            part = _part(text, None)
            out += self._event({"type": "response.content_part.done"} | where | {"part": part})
            item = _message(item_id, "completed", [part])
            self.message["content"] = text
        elif self._call is not None:
            item, self._call = self._call | {"status": "completed"}, None
            done = {"type": "response.function_call_arguments.done", "item_id": item["id"]}
            done |= {"output_index": index, "arguments": item["arguments"], "name": item["name"]}
            out += self._event(done)
            function = {"name": item["name"], "arguments": item["arguments"]}
            call = {"id": item["call_id"], "type": "function", "function": function}
            self.message["tool_calls"] = [*self.message.get("tool_calls", []), call]
        else:
            return b""
        self._items.append(item)
        return out + self._event(
            {"type": "response.output_item.done", "output_index": index, "item": item}
        )

    def _completed(self, usage: Mapping[str, Any], timings: Json | None) -> bytes:
        """The closing ``response.completed``, also for an answer that stopped at
        ``max_output_tokens`` (its status inside is then ``incomplete``), as vLLM sends it."""
        out = self._close()
        used = _usage(
            usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), cached_of(usage)
        )
        status = _status(self._finish)
        done = response(self._id, self._request, self._created, self._items, used, status, timings)
        self.final = done
        return out + self._event({"type": "response.completed", "response": done})
