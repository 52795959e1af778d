"""``local-vllm record``: capture one running stack's real answers as test fixtures.

For each server (``standard``, ``ngram``, ``draft``) it writes, under ``OUT/<server>/``:
the raw SSE body of a streamed chat answer with and without
``stream_options.include_usage``, a streamed completion with usage, a streamed tool call
(named ``tool_choice``), a non-streaming chat answer, and then the server's ``/metrics``
page. Every request is greedy with a fixed prompt, so a new recording differs from the old
one only where vLLM or the models changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localvllm.stackfile import StackState

_MESSAGES = [{"role": "user", "content": "def parse(self, text):\n    return text.split()\n"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


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


def record_all(state: StackState, out: Path, progress: Callable[[str], None]) -> None:
    with httpx.Client(timeout=120.0) as client:
        for server in state.servers:
            folder = out / server.name
            folder.mkdir(parents=True, exist_ok=True)
            for name, (path, body) in requests(state.model).items():
                response = client.post(server.url + path, json=body)
                (folder / name).write_bytes(response.content)
                progress(f"{server.name}: {name} ({response.status_code})")
            metrics = client.get(server.url + "/metrics")
            (folder / "metrics.txt").write_bytes(metrics.content)
            progress(f"{server.name}: metrics.txt")
