"""Request bodies and headers for a scenario's traffic classes. Pure: no I/O, no clock.

Each body is written so that the simulator reads it as the intended workload (see
``backends/sim/workload.py``): JSON output carries a ``json_schema`` response format, tool
calls carry the class's ``tools`` with ``tool_choice: required``, code asks for Python in a
fence, summaries say "Summarise", and chat and creative prompts avoid every code marker.
Prompts are padded with plain prose to about the class's ``prompt_tokens``. Each class
speaks its API (``Traffic.api``): chat, text completions, Anthropic's Messages (the key as
``x-api-key``) or OpenAI's Responses, each body saying the same in that API's words. A
class's ``template`` opens its prompt, so the gateway knows its application by it.

A class with a ``session`` sends conversations instead (``Talk``): each turn resends the
whole history in its API's words (Messages with ``tool_use`` and ``tool_result`` blocks and
Claude Code's billing line when asked, Responses with ``store: false`` and the full
``input`` of ``function_call`` and ``function_call_output`` items, chat with ``tool_calls``
and ``tool`` messages), so a turn's prompt begins with the whole prompt of the turn
before, as an agent's does.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

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
    lead = _opening(traffic, client) + _LEADS[traffic.workload]
    pad = max(0, traffic.prompt_tokens - len(lead) // 4 - 8)
    text = lead + ("\n\n" + _FILLER * (pad * 4 // len(_FILLER) + 1) if pad > 16 else "")
    key = f"sk-{traffic.keys or scenario}-{client % traffic.api_keys}"
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


def _opening(traffic: Traffic, client: int) -> str:
    """The class's template, as the first words of its prompt (all four APIs alike), in
    variant ``client mod templates`` (named in letters: digits would read as an id)."""
    if not traffic.template:
        return ""
    if traffic.templates == 1:
        return traffic.template + "\n\n"
    n, name = client % traffic.templates, ""
    while True:
        n, digit = divmod(n, 26)
        name = chr(ord("a") + digit) + name
        if n == 0:
            break
    return f"{traffic.template} Desk {name}.\n\n"


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
    headers = {"authorization": f"Bearer sk-{traffic.keys or scenario}-{client % traffic.api_keys}"}
    return Built(body, headers)


# --- multi-turn conversations (``Traffic.session``) ----------------------------------------

_PROSE = (
    "the report table river garden window market letter station morning evening museum "
    "bridge harbour meadow village council budget figure column ledger folder paper ticket "
    "summer winter autumn spring journey travel weather mountain forest valley island coast "
    "orange yellow purple silver copper marble velvet cotton linen wooden stone glass quiet "
    "steady gentle bright careful simple modern ancient local regional annual weekly daily "
    "review record update measure listen gather follow arrange prepare deliver collect "
    "notice explain describe compare consider suggest discuss reply answer result request "
    "account balance invoice customer supplier partner manager member visitor neighbour "
    "kitchen library office hallway balcony cellar garage studio theatre concert lecture"
)
_WORDS = _PROSE.split(" ")
_CHARS = 4  # the simulator's (and a rough tokenizer's) characters per token


def _words(rng: random.Random, tokens: int) -> str:
    """Plain prose of about ``tokens`` tokens, drawn from ``rng``."""
    out: list[str] = []
    size = 0
    while size < tokens * _CHARS:
        chunk = rng.choices(_WORDS, k=64)
        out.append(" ".join(chunk) + ".")
        size += sum(map(len, chunk)) + 64
    return " ".join(out)


@dataclass(slots=True)
class Talk:
    """One conversation of a session class (``Session``), drawn from ``key`` (the
    scenario's seed and name, the class, the client and the conversation's number): its
    turns, its opening and what each turn adds, made as the turns come. ``turn`` is the
    next turn to send (1 first)."""

    key: str
    traffic: Traffic
    number: int
    turns: int
    system: str
    opening: str
    growth: list[int]  # tokens each later turn adds, model's part and tool's result together
    version: str
    added: list[tuple[str, str]] = field(default_factory=list)  # (call arguments, result)
    turn: int = 1

    @classmethod
    def draw(cls, scenario: str, seed: int, traffic: Traffic, client: int, number: int) -> Talk:
        session = traffic.session
        assert session is not None
        key = f"{seed}:{scenario}:{traffic.name}:{client}:{number}"
        rng = random.Random(key)
        turns = rng.randint(session.min_turns, session.max_turns)
        first = round(session.first_tokens * rng.uniform(0.9, 1.1))
        last = max(first, round(session.last_tokens * rng.uniform(0.8, 1.0)))
        weights = [rng.expovariate(1.0) for _ in range(turns - 1)]
        total = sum(weights) or 1.0
        growth = [max(8, round((last - first) * w / total)) for w in weights]
        system = _words(random.Random(f"{seed}:{scenario}:{traffic.name}"), session.system_tokens)
        opening = _words(rng, max(16, first - session.system_tokens))
        version = f"2.1.{rng.randint(10, 99)}.{rng.getrandbits(12):03x}"
        return cls(key, traffic, number, turns, system, opening, growth, version)

    @property
    def done(self) -> bool:
        return self.turn > self.turns

    def answered(self) -> None:
        """The turn sent was answered: the next one is due."""
        self.turn += 1

    def body(self, scenario: str, client: int, model: str) -> Built:
        """The request of the turn due, in the class's API, with the whole history."""
        while len(self.added) < self.turn - 1:
            n = len(self.added)
            rng = random.Random(f"{self.key}:{n}")
            size = self.growth[n]
            call = _words(rng, max(4, size // 10))
            self.added.append((call, _words(rng, max(4, size - size // 10))))
        traffic = self.traffic
        key = f"sk-{scenario}-{client % traffic.api_keys}"
        user = f"user-{client % traffic.users}" if traffic.users else None
        steps = self.added[: self.turn - 1]
        if traffic.api == "messages":
            body, headers = self._messages(model, steps, user), {"x-api-key": key}
        elif traffic.api == "responses":
            body, headers = self._responses(model, steps, user), {"authorization": f"Bearer {key}"}
        else:
            body, headers = self._chat(model, steps, user), {"authorization": f"Bearer {key}"}
        if traffic.endpoint:
            headers["x-speclane-endpoint"] = traffic.endpoint
        return Built(body, headers, _PATHS[traffic.api])

    def _billing(self) -> str:
        cch = hashlib.blake2b(f"{self.key}:{self.turn}".encode(), digest_size=3).hexdigest()
        return (
            f"x-anthropic-billing-header: cc_version={self.version}; "
            f"cc_entrypoint=cli; cch={cch[:5]};"
        )

    def _messages(
        self, model: str, steps: list[tuple[str, str]], user: str | None
    ) -> dict[str, Any]:
        body = _messages(self.traffic, self.opening, model, user)
        system: list[dict[str, Any]] = [{"type": "text", "text": self.system}]
        if self.traffic.session is not None and self.traffic.session.billing:
            system.insert(0, {"type": "text", "text": self._billing()})
        body["system"] = system
        messages: list[dict[str, Any]] = [{"role": "user", "content": self.opening}]
        for n, (call, result) in enumerate(steps):
            if self.traffic.tools:
                name = self.traffic.tools[0].name
                use = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": name}
                messages.append({"role": "assistant", "content": [{**use, "input": {"q": call}}]})
                back = {"type": "tool_result", "tool_use_id": f"toolu_{n:04d}", "content": result}
                messages.append({"role": "user", "content": [back]})
            else:
                messages.append({"role": "assistant", "content": call})
                messages.append({"role": "user", "content": result})
        body["messages"] = messages
        return body

    def _responses(
        self, model: str, steps: list[tuple[str, str]], user: str | None
    ) -> dict[str, Any]:
        body = _responses(self.traffic, self.opening, model, user)
        body["instructions"] = self.system
        body["store"] = False
        items: list[dict[str, Any]] = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": self.opening}],
            }
        ]
        for n, (call, result) in enumerate(steps):
            if self.traffic.tools:
                name = self.traffic.tools[0].name
                arguments = orjson.dumps({"q": call}).decode()
                items.append(
                    {
                        "type": "function_call",
                        "call_id": f"call_{n:04d}",
                        "name": name,
                        "arguments": arguments,
                    }
                )
                items.append(
                    {"type": "function_call_output", "call_id": f"call_{n:04d}", "output": result}
                )
            else:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": call}],
                    }
                )
                items.append(
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": result}],
                    }
                )
        body["input"] = items
        return body

    def _chat(self, model: str, steps: list[tuple[str, str]], user: str | None) -> dict[str, Any]:
        built = _chat("", self.traffic, 0, model, self.opening)
        body = built.body
        if user is not None:
            body["user"] = user
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.opening},
        ]
        for n, (call, result) in enumerate(steps):
            if self.traffic.tools:
                name = self.traffic.tools[0].name
                arguments = orjson.dumps({"q": call}).decode()
                fn = {"name": name, "arguments": arguments}
                messages.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": f"call_{n:04d}", "type": "function", "function": fn}],
                    }
                )
                messages.append(
                    {"role": "tool", "tool_call_id": f"call_{n:04d}", "content": result}
                )
            else:
                messages.append({"role": "assistant", "content": call})
                messages.append({"role": "user", "content": result})
        body["messages"] = messages
        return body
