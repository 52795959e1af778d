"""Deterministic pseudo-text for simulated answers: one token is one short piece of text.

Prose and code come from corpora built once per server from its seed, so an answer is a
slice of a corpus (cheap enough for the zero-latency benchmark mode). JSON answers and tool
call arguments are generated per request and are valid JSON whenever the answer ends
naturally (a ``length`` cut leaves them truncated, as a real model's would be).

Pure: no I/O, no clock; randomness only from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import orjson

from backends.sim.model import RequestProfile
from backends.sim.workload import Workload

_WORDS = tuple(
    " ".join(
        (
            "the model request answer token draft target engine batch step speed latency cache",
            "memory user system route pool policy signal value result context window number",
            "simple quick careful small large early late first next last every other same",
            "is are was can will should may runs reads sends keeps moves finds gives makes",
            "and or but so because while when if then also still only just very more less",
        )
    ).split()
)
_CODE_LINES = (
    ("def", " compute", "_total", "(", "items", "):", "\n"),
    ("    ", "total", " =", " 0", "\n"),
    ("    ", "for", " item", " in", " items", ":", "\n"),
    ("        ", "total", " +=", " item", ".", "price", "\n"),
    ("    ", "return", " total", "\n"),
    ("\n", "class", " Cache", ":", "\n"),
    ("    ", "def", " get", "(", "self", ",", " key", "):", "\n"),
    ("        ", "return", " self", ".", "_data", ".", "get", "(", "key", ")", "\n"),
    ("import", " json", "\n"),
    ("    ", "if", " not", " items", ":", "\n", "        ", "return", " None", "\n"),
)
_KEYS = ("name", "id", "status", "count", "items", "score", "label", "city", "query", "limit")
_CORPUS_TOKENS = 8192
_CUT = 8  # tokens a cut structured answer would still have needed


def _prose(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    sentence = 0
    while len(out) < n:
        word = rng.choice(_WORDS)
        out.append((" " + word) if sentence else (" " + word.capitalize()))
        sentence += 1
        if sentence > 6 and rng.random() < 0.2:
            out.append(".\n\n" if rng.random() < 0.2 else ".")
            sentence = 0
    return out


def _code(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        out.extend(rng.choice(_CODE_LINES))
    return out


class TextBank:
    """Token pieces for answers; built once per server, then read-only."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(f"{seed}:corpus")
        self._prose = tuple(_prose(rng, _CORPUS_TOKENS))
        self._code = tuple(_code(rng, _CORPUS_TOKENS))

    def tokens(self, profile: RequestProfile, properties: Mapping[str, object]) -> list[str]:
        """The answer's ``profile.output_tokens`` pieces (tool calls: arguments only). A
        structured answer cut by ``max_tokens`` is the start of a longer one, so it does not
        close, as in vLLM."""
        n = profile.output_tokens
        more = _CUT if profile.finish_reason == "length" else 0
        if profile.tool_name is not None:
            # The first token of a tool call is its name; the rest are the arguments.
            if n <= 1:
                return []
            if properties:
                return schema_tokens(profile.rng("text"), n - 1 + more, properties)[: n - 1]
            return json_tokens(profile.rng("text"), n - 1 + more, _KEYS[:3])[: n - 1]
        if profile.workload is Workload.JSON:
            if properties:  # a json_schema: guided decoding follows it, as vLLM's does
                return schema_tokens(profile.rng("text"), n + more, properties)[:n]
            return json_tokens(profile.rng("text"), n + more, _KEYS)[:n]
        corpus = self._code if profile.workload is Workload.CODE else self._prose
        start = profile.draw("text") % (len(corpus) - n) if n < len(corpus) else 0
        out = list(corpus[start : start + n])
        while len(out) < n:
            out.extend(corpus[: n - len(out)])
        return out


def _value(rng: random.Random, schema: object) -> str | None:
    """One token holding a value of ``schema``'s type; None for a string (several tokens)."""
    if not isinstance(schema, Mapping):
        return None
    for fixed in ("const", "enum"):
        if fixed in schema:
            value = schema[fixed][0] if fixed == "enum" and schema[fixed] else schema[fixed]
            return " " + orjson.dumps(value).decode()
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "integer":
        return f" {rng.randint(0, 999)}"
    if kind == "number":
        return f" {rng.randint(0, 99)}.{rng.randint(0, 9)}"
    if kind == "boolean":
        return rng.choice((" true", " false"))
    fixed_values = {"null": " null", "array": " []", "object": " {}"}
    return fixed_values.get(kind) if isinstance(kind, str) else None


def schema_tokens(rng: random.Random, n: int, properties: Mapping[str, object]) -> list[str]:
    """``n`` pieces that join to one JSON object with exactly ``properties``' keys in order,
    each value of its type (the last string takes the words left over), as far as ``n``
    reaches; whitespace before the closing brace keeps the count exact."""
    fields = [(key, _value(rng, schema)) for key, schema in properties.items()]
    costs = [2 if value is not None else 3 for _, value in fields]
    last_string = max((i for i, (_, v) in enumerate(fields) if v is None), default=-1)
    out = ["{"]
    for i, (key, value) in enumerate(fields):
        if len(out) + costs[i] + 1 > n:
            break
        out.append(f'{", " if i else ""}"{key}":')
        if value is not None:
            out.append(value)
            continue
        out.append(' "')
        room = n - len(out) - 2 - sum(costs[i + 1 :])
        words = room if i == last_string else min(room, rng.randint(1, 6))
        out += [("" if j == 0 else " ") + rng.choice(_WORDS) for j in range(max(words, 0))]
        out.append('"')
    out += [" "] * (n - 1 - len(out))
    return (out + ["}"])[:n]


def json_tokens(rng: random.Random, n: int, keys: tuple[str, ...]) -> list[str]:
    """``n`` pieces that join to one JSON object (when ``n`` >= 2; fewer cannot close one)."""
    out = ["{"]
    in_string = False
    fields = 0
    while len(out) < n:
        left = n - len(out)
        if in_string:
            if left <= 2 or (out[-1] != ' "' and rng.random() < 0.15):
                out.append('"')
                in_string = False
                fields += 1
            else:
                out.append(("" if out[-1] == ' "' else " ") + rng.choice(_WORDS))
        elif left == 1:
            out.append("}")
        elif left >= 4:
            key = keys[fields % len(keys)]
            key = key if fields < len(keys) else f"{key}_{fields // len(keys)}"
            out.append(f'{", " if fields else ""}"{key}":')
            out.append(' "')
            in_string = True
        else:
            out.append(" ")  # whitespace before the closing brace keeps the count exact
    return out[:n]
