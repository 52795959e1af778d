"""Request bodies and headers for a scenario's traffic classes. Pure: no I/O, no clock.

Each body is written so that the simulator reads it as the intended workload (see
``backends/sim/workload.py``): JSON output carries a ``json_schema`` response format, tool
calls carry the class's ``tools`` with ``tool_choice: required``, code asks for Python in a
fence, summaries say "Summarise", and chat and creative prompts avoid every code marker.
Prompts are padded with plain prose to about the class's ``prompt_tokens``.
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


@dataclass(frozen=True, slots=True)
class Built:
    body: dict[str, Any]
    headers: dict[str, str]


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
    if traffic.endpoint:
        headers["x-speclane-endpoint"] = traffic.endpoint
    return Built(body, headers)
