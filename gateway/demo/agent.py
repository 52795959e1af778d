"""The demo's coding agent: a client that speaks Anthropic's Messages API (``/v1/messages``)
as Claude Code does, with tool use over several turns. Pure: no I/O, no clock.

Each conversation is one task. Every turn sends the whole conversation so far with the
agent's tools; the first turns require a tool (``tool_choice: any``), and the agent answers
each ``tool_use`` with a ``tool_result`` before the next turn; the last turn lets the model
answer in text. The simulator reads these turns as tool calls (the tools workload), so
their slice is the one chat's tool calls with the same schemas fall in when the policy
slices by tool schema.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from gateway.demo.workload import MODEL

PATH = "/v1/messages"
TURNS = 3  # requests per conversation: tool calls, then an answer
MAX_TOKENS = 48
TOOLS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a file of the repository",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "run_tests",
        "description": "Run the test suite, or one test file",
        "input_schema": {
            "type": "object",
            "properties": {"target": {"type": "string"}},
            "required": ["target"],
        },
    },
]
_TASKS = (
    "The date parser rejects ISO weeks. Find out why and fix it.",
    "Add a --dry-run flag to the sync command.",
    "The cache test is flaky on CI. Look into it.",
)
_RESULTS = ("def parse(text):\n    return int(text)\n", "2 passed, 1 failed", "no such file")


@dataclass(slots=True)
class Conversation:
    """One task of the agent, turn by turn."""

    index: int
    rng: random.Random
    turn: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, index: int, seed: int) -> Conversation:
        rng = random.Random(f"{seed}:agent:{index}")
        task = {"role": "user", "content": rng.choice(_TASKS)}
        return cls(index, rng, messages=[task])

    @property
    def last(self) -> bool:
        return self.turn >= TURNS - 1

    def body(self) -> dict[str, Any]:
        """The next request: the conversation so far, streamed."""
        return {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "system": "You are a coding agent. Use the tools to inspect and test the code.",
            "messages": list(self.messages),
            "tools": TOOLS,
            "tool_choice": {"type": "auto" if self.last else "any"},
            "temperature": 0,
            "stream": True,
            "metadata": {"user_id": f"agent-{self.index}"},
        }

    def answered(self, content: list[dict[str, Any]]) -> bool:
        """The model's answer to the last request (its content blocks); whether the agent
        goes on (it called a tool and has turns left)."""
        self.turn += 1
        uses = [block for block in content if block.get("type") == "tool_use"]
        if not uses or self.turn >= TURNS:
            return False
        self.messages.append({"role": "assistant", "content": content})
        results = [
            {"type": "tool_result", "tool_use_id": use["id"], "content": self.rng.choice(_RESULTS)}
            for use in uses
        ]
        self.messages.append({"role": "user", "content": results})
        return True
