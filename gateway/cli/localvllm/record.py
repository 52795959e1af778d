"""``local-vllm record``: capture one running stack's real answers as test fixtures.

For each server (``standard``, ``ngram``, ``draft``) it writes, under ``OUT/<server>/``:
the raw SSE body of a streamed chat answer with and without
``stream_options.include_usage``, a streamed completion with usage, a streamed tool call
(named ``tool_choice``), a non-streaming chat answer; the same text asked through
Anthropic's Messages API and OpenAI's Responses API, whole and streamed, with a named tool
streamed, ``count_tokens`` and a Responses structured output (``agent_requests``); two
turns of one conversation with a long system prompt on each API, the second resending the
first (``prefix_requests``: its answers carry the prefix cache's hits); and then the
server's ``/metrics`` page (with the prefix-cache counters those turns moved). Every
request is greedy with a fixed prompt, so a new recording differs from the old one only
where vLLM or the models changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localvllm.stackfile import StackState

_MESSAGES = [{"role": "user", "content": "def parse(self, text):\n    return text.split()\n"}]
_WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TOOL = {"type": "function", "function": _WEATHER}


def requests(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """File name -> (path, body) of every recorded request."""
    chat = {"model": model, "messages": _MESSAGES, "temperature": 0, "max_tokens": 32}
    usage = {"stream_options": {"include_usage": True}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    tools = {"tools": [TOOL], "tool_choice": named}
    return {
        "chat-stream.sse": ("/v1/chat/completions", chat | {"stream": True}),
        "chat-stream-include-usage.sse": (
            "/v1/chat/completions",
            chat | {"stream": True} | usage,
        ),
        "completions-stream-include-usage.sse": (
            "/v1/completions",
            {"model": model, "prompt": "def main(", "temperature": 0, "max_tokens": 32}
            | {"stream": True}
            | usage,
        ),
        "chat-stream-tool-call.sse": (
            "/v1/chat/completions",
            chat | tools | {"stream": True} | usage,
        ),
        "chat-nonstream.json": ("/v1/chat/completions", chat),
    }


def agent_requests(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """File name -> (path, body) of the requests recorded through Messages and Responses."""
    function = _WEATHER
    messages = {"model": model, "messages": _MESSAGES, "temperature": 0, "max_tokens": 32}
    tool = {
        "tools": [
            {
                **{k: function[k] for k in ("name", "description")},
                "input_schema": function["parameters"],
            }
        ],
        "tool_choice": {"type": "tool", "name": function["name"]},
    }
    responses = {"model": model, "input": _MESSAGES[0]["content"], "temperature": 0}
    responses |= {"max_output_tokens": 32}
    named = {
        "tools": [{"type": "function", **function}],
        "tool_choice": {"type": "function", "name": function["name"]},
    }
    schema = {"type": "json_schema", "name": "city", "schema": function["parameters"]}
    return {
        "messages-nonstream.json": ("/v1/messages", messages),
        "messages-stream.sse": ("/v1/messages", messages | {"stream": True}),
        "messages-stream-tool-use.sse": ("/v1/messages", messages | tool | {"stream": True}),
        "messages-count-tokens.json": (
            "/v1/messages/count_tokens",
            {"model": model, "messages": _MESSAGES},
        ),
        "responses-nonstream.json": ("/v1/responses", responses),
        "responses-stream.sse": ("/v1/responses", responses | {"stream": True}),
        "responses-stream-function-call.sse": (
            "/v1/responses",
            responses | named | {"stream": True},
        ),
        "responses-nonstream-json-schema.json": (
            "/v1/responses",
            responses | {"text": {"format": schema}},
        ),
    }


# Long enough to fill a few KV blocks of vLLM's CPU block size (128 tokens).
_SYSTEM = "You review Python code. Point out bugs first, then style, one line each. " * 24


def prefix_requests(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """File name -> (path, body): a first turn and a second one that resends it, per API, in
    order (each ``*-turn2`` finds its ``*-turn1`` in the prefix cache)."""
    first = {"role": "user", "content": _MESSAGES[0]["content"]}
    more = [{"role": "assistant", "content": "It splits on whitespace."}]
    more.append({"role": "user", "content": "And on tabs?"})
    chat = {"model": model, "temperature": 0, "max_tokens": 16}
    history: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM}, first]
    turn1 = chat | {"messages": history}
    turn2 = chat | {"messages": [*history, *more]}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    claude = {"model": model, "temperature": 0, "max_tokens": 16, "system": _SYSTEM}
    prompt = {"model": model, "temperature": 0, "max_tokens": 16, "prompt": _SYSTEM}
    responses = {"model": model, "temperature": 0, "max_output_tokens": 16}
    responses |= {"instructions": _SYSTEM, "store": False}
    return {
        "prefix-chat-turn1.json": ("/v1/chat/completions", turn1),
        "prefix-chat-turn2.json": ("/v1/chat/completions", turn2),
        "prefix-chat-turn2-stream.sse": ("/v1/chat/completions", turn2 | usage),
        "prefix-completions-turn1.json": ("/v1/completions", prompt),
        "prefix-completions-turn2.json": ("/v1/completions", prompt | {"prompt": _SYSTEM * 2}),
        "prefix-messages-turn1.json": ("/v1/messages", claude | {"messages": [first]}),
        "prefix-messages-turn2.json": ("/v1/messages", claude | {"messages": [first, *more]}),
        "prefix-messages-turn2-stream.sse": (
            "/v1/messages",
            claude | {"messages": [first, *more], "stream": True},
        ),
        "prefix-responses-turn1.json": ("/v1/responses", responses | {"input": [first]}),
        "prefix-responses-turn2.json": ("/v1/responses", responses | {"input": [first, *more]}),
    }


def record_all(state: StackState, out: Path, progress: Callable[[str], None]) -> None:
    with httpx.Client(timeout=120.0) as client:
        for server in state.servers:
            folder = out / server.name
            folder.mkdir(parents=True, exist_ok=True)
            recorded = requests(state.model) | agent_requests(state.model)
            recorded |= prefix_requests(state.model)
            for name, (path, body) in recorded.items():
                response = client.post(server.url + path, json=body)
                (folder / name).write_bytes(response.content)
                progress(f"{server.name}: {name} ({response.status_code})")
            metrics = client.get(server.url + "/metrics")
            (folder / "metrics.txt").write_bytes(metrics.content)
            progress(f"{server.name}: metrics.txt")
