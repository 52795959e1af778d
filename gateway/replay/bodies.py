"""Request bodies and headers for a scenario's traffic classes. Pure: no I/O, no clock.

Each body is written so that the simulator reads it as the intended workload (see
``backends/sim/workload.py``): JSON output carries a ``json_schema`` response format, tool
calls carry the class's ``tools`` with ``tool_choice: required``, code asks for Python in a
fence, summaries say "Summarise", and chat and creative prompts avoid every code marker.
Prompts are padded with plain prose to about the class's ``prompt_tokens``. Each class
speaks its API (``Traffic.api``): chat, text completions, Anthropic's Messages (the key as
``x-api-key``) or OpenAI's Responses, each body saying the same in that API's words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.sim.workload import Workload
from gateway.replay.scenario import Tool, Traffic

_FILLER = "The committee reviewed the regional figures and agreed to revisit the plan next week. "
_LEADS = {
    Workload.JSON: "Extract the vendor, number and amount as JSON from this note.",
    Workload.TOOLS: "Look this up for me.",
    Workload.CODE: "Complete this Python:\n```python\ndef handle(request):\n    ",
    Workload.CHAT: "How should I plan a relaxed weekend away?",
    Workload.CREATIVE: "Tell a short story about a lighthouse keeper.",
    Workload.SUMMARISE: "Summarise this report in five bullet points.",
}
_SCHEMA = {
    "name": "note",
    "schema": {
        "type": "object",
        "properties": {"vendor": {"type": "string"}, "amount": {"type": "number"}},
    },
}


_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}


@dataclass(frozen=True, slots=True)
class Built:
    body: dict[str, Any]
    headers: dict[str, str]
    path: str = "/v1/chat/completions"


def tool_json(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": kind} for arg, kind in tool.parameters.items()},
            },
        },
    }


def build(scenario: str, traffic: Traffic, client: int, model: str) -> Built:
    """A request of ``traffic`` sent by ``client``."""
    lead = _LEADS[traffic.workload]
    pad = max(0, traffic.prompt_tokens - len(lead) // 4 - 8)
    text = lead + ("\n\n" + _FILLER * (pad * 4 // len(_FILLER) + 1) if pad > 16 else "")
    key = f"sk-{scenario}-{client % traffic.api_keys}"
    user = f"user-{client % traffic.users}" if traffic.users else None
    if traffic.api == "messages":
        built = Built(_messages(traffic, text, model, user), {"x-api-key": key})
    elif traffic.api == "responses":
        built = Built(_responses(traffic, text, model, user), {"authorization": f"Bearer {key}"})
    elif traffic.api == "completions":
        built = Built(_completion(traffic, text, model, user), {"authorization": f"Bearer {key}"})
    else:
        built = _chat(scenario, traffic, client, model, text)
    if traffic.endpoint:
        built.headers["x-speclane-endpoint"] = traffic.endpoint
    return Built(built.body, built.headers, _PATHS[traffic.api])


def _messages(traffic: Traffic, text: str, model: str, user: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": traffic.max_tokens,
        "messages": [{"role": "user", "content": text}],
        "temperature": traffic.temperature,
        "stream": traffic.stream,
    }
    if traffic.tools:
        body["tools"] = [
            {"name": t.name, "input_schema": tool_json(t)["function"]["parameters"]}
            for t in traffic.tools
        ]
        body["tool_choice"] = {"type": "any"}
    if user is not None:
        body["metadata"] = {"user_id": user}
    return body


def _responses(traffic: Traffic, text: str, model: str, user: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "input": text,
        "max_output_tokens": traffic.max_tokens,
        "temperature": traffic.temperature,
        "stream": traffic.stream,
    }
    if traffic.workload is Workload.JSON:
        body["text"] = {"format": {"type": "json_schema", **_SCHEMA}}
    if traffic.tools:
        body["tools"] = [{"type": "function", **tool_json(t)["function"]} for t in traffic.tools]
        body["tool_choice"] = "required"
    if user is not None:
        body["user"] = user
    return body


def _completion(traffic: Traffic, text: str, model: str, user: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": text,
        "max_tokens": traffic.max_tokens,
        "temperature": traffic.temperature,
        "stream": traffic.stream,
    }
    if traffic.stream:
        body["stream_options"] = {"include_usage": True}
    if user is not None:
        body["user"] = user
    return body


def _chat(scenario: str, traffic: Traffic, client: int, model: str, text: str) -> Built:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": traffic.max_tokens,
        "temperature": traffic.temperature,
        "stream": traffic.stream,
    }
    if traffic.stream:
        body["stream_options"] = {"include_usage": True}
    if traffic.workload is Workload.JSON:
        body["response_format"] = {"type": "json_schema", "json_schema": _SCHEMA}
    if traffic.tools:
        body["tools"] = [tool_json(t) for t in traffic.tools]
        body["tool_choice"] = "required"
    if traffic.users:
        body["user"] = f"user-{client % traffic.users}"
    headers = {"authorization": f"Bearer sk-{scenario}-{client % traffic.api_keys}"}
    return Built(body, headers)
