"""The demo's six request kinds and their seeded mix. Pure: no I/O, no clock.

Each body is written so that the simulator reads it as the intended workload (see
``backends/sim/workload.py``): JSON extraction carries a ``json_schema`` response format,
tool calls carry ``tools`` with ``tool_choice: required``, code completion contains Python,
the summarisation prompt is a ~10k-token report, and chat and creative prompts avoid every
code marker and differ only by temperature (0.7 and 1.0).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from backends.sim.workload import Workload

MODEL = "qwen3-32b"
CODE_ENDPOINT = "code-assist"
ENDPOINT_HEADER = "x-speclane-endpoint"
DOCUMENT_TOKENS = 10_000

LABELS: Mapping[Workload, str] = {
    Workload.JSON: "JSON extraction",
    Workload.TOOLS: "tool calls",
    Workload.CODE: "code completion",
    Workload.CHAT: "chat",
    Workload.CREATIVE: "creative writing",
    Workload.SUMMARISE: "long-context summary",
}
ORDER = tuple(LABELS)
# Share of the traffic; code gets the most so that its guardrail sees enough samples.
WEIGHTS: Mapping[Workload, float] = {
    Workload.JSON: 0.16,
    Workload.TOOLS: 0.14,
    Workload.CODE: 0.28,
    Workload.CHAT: 0.18,
    Workload.CREATIVE: 0.16,
    Workload.SUMMARISE: 0.08,
}
# Short answers, so that a one-minute run has a few hundred requests.
MAX_TOKENS: Mapping[Workload, int] = {
    Workload.JSON: 64,
    Workload.TOOLS: 48,
    Workload.CODE: 48,
    Workload.CHAT: 64,
    Workload.CREATIVE: 64,
    Workload.SUMMARISE: 64,
}

_INVOICES = (
    "Invoice 4411 from Acme Corp, issued 2025-02-01, due 2025-03-01, total 1,250.00 EUR.",
    "Receipt 88-120 from Northwind Traders dated 12 May 2025: 3 items, 86.40 USD paid by card.",
    "Bill no. 7731, Globex Ltd, period April 2025, amount due 412.19 GBP by 30 May.",
)
_FUNCTIONS = (
    "def parse_duration(text: str) -> int:\n    ",
    "def median(values: list[float]) -> float:\n    ",
    "class LRUCache:\n    def __init__(self, capacity: int) -> None:\n        ",
    "def slugify(title: str) -> str:\n    ",
)
_CHATS = (
    "How should I plan a relaxed three-day trip to Lisbon?",
    "What are good ways to keep houseplants alive during a heatwave?",
    "Can you explain the difference between a loan and a line of credit?",
    "I have a job interview tomorrow. How do I prepare in one evening?",
)
_STORIES = (
    "Write a short poem about the sea at dawn.",
    "Tell a bedtime story about a lighthouse keeper and a lost seal.",
    "Write the opening paragraph of a mystery set in a snowed-in mountain hotel.",
)
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Reserve a restaurant table",
            "parameters": {
                "type": "object",
                "properties": {"restaurant": {"type": "string"}, "people": {"type": "integer"}},
                "required": ["restaurant", "people"],
            },
        },
    },
]
_INVOICE_SCHEMA = {
    "name": "invoice",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {
            "vendor": {"type": "string"},
            "number": {"type": "string"},
            "due": {"type": "string"},
            "amount": {"type": "number"},
            "currency": {"type": "string"},
        },
        "required": ["vendor", "number", "amount", "currency"],
    },
}


@dataclass(frozen=True, slots=True)
class DemoRequest:
    """The ``index``-th request of a run: its workload, body and extra headers."""

    index: int
    workload: Workload
    body: Mapping[str, Any]
    headers: Mapping[str, str]


class Mix:
    """The seeded sequence of requests: the same seed gives the same requests in order."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._kinds = list(WEIGHTS)
        self._weights = [WEIGHTS[w] for w in self._kinds]

    def request(self, index: int) -> DemoRequest:
        rng = random.Random(f"{self._seed}:{index}")
        workload = rng.choices(self._kinds, self._weights)[0]
        return build(workload, index, rng)


def build(workload: Workload, index: int, rng: random.Random) -> DemoRequest:
    """One request of ``workload``; ``user`` is set per request so that the gateway's
    probe and shadow sampling (which hashes it) is the same on every run with this seed."""
    body: dict[str, Any] = {
        "model": MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": MAX_TOKENS[workload],
        "user": f"demo-{index}",
    }
    headers: dict[str, str] = {}
    body |= _BUILDERS[workload](rng)
    if workload is Workload.CODE:
        headers[ENDPOINT_HEADER] = CODE_ENDPOINT
    return DemoRequest(index, workload, body, headers)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _json(rng: random.Random) -> dict[str, Any]:
    text = "Extract vendor, number, due date, amount and currency:\n" + rng.choice(_INVOICES)
    return {
        "messages": _user(text),
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": _INVOICE_SCHEMA},
    }


def _tools(rng: random.Random) -> dict[str, Any]:
    ask = rng.choice(("Is it raining in Oslo right now?", "Get me a table for 4 at Nopa."))
    return {"messages": _user(ask), "temperature": 0, "tools": _TOOLS, "tool_choice": "required"}


def _code(rng: random.Random) -> dict[str, Any]:
    text = "Complete this Python:\n```python\n" + rng.choice(_FUNCTIONS)
    return {"messages": _user(text), "temperature": 0}


def _chat(rng: random.Random) -> dict[str, Any]:
    return {"messages": _user(rng.choice(_CHATS)), "temperature": 0.7}


def _creative(rng: random.Random) -> dict[str, Any]:
    return {"messages": _user(rng.choice(_STORIES)), "temperature": 1.0}


def _summarise(rng: random.Random) -> dict[str, Any]:
    text = "Summarise this report in five bullet points.\n\n" + document(rng.randrange(3))
    return {"messages": _user(text), "temperature": 0.3}


_BUILDERS = {
    Workload.JSON: _json,
    Workload.TOOLS: _tools,
    Workload.CODE: _code,
    Workload.CHAT: _chat,
    Workload.CREATIVE: _creative,
    Workload.SUMMARISE: _summarise,
}

_SUBJECTS = ("Regional sales", "The northern warehouse", "Customer support", "The audit team")
_VERBS = ("grew", "slowed", "recovered", "held steady", "doubled", "fell back")
_DETAILS = (
    "after the spring price review",
    "despite longer delivery times",
    "as two new stores opened",
    "while staffing stayed flat",
    "once the backlog was cleared",
    "in line with the annual plan",
)


@cache
def document(variant: int) -> str:
    """A plain-prose report of about ``DOCUMENT_TOKENS`` tokens (four characters each)."""
    rng = random.Random(f"document:{variant}")
    sentences: list[str] = []
    size = 0
    while size < DOCUMENT_TOKENS * 4:
        sentence = (
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} by {rng.randint(2, 40)} percent "
            f"in week {rng.randint(1, 52)} {rng.choice(_DETAILS)}."
        )
        sentences.append(sentence)
        size += len(sentence) + 1
    return " ".join(sentences)
