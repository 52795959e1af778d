"""Structured-output and tool-call validity: does the answer parse, and does it validate
against what the request asked for? Speculative decoding is lossless, so it must never
change these numbers; they are counted by pool to show that it does not.

``expect(payload)`` reads what a request asked for: ``response_format`` ``json_object`` (the
answer parses as a JSON object) or ``json_schema`` (it also validates against the schema),
and ``tools`` (each tool call names an offered tool and its arguments parse and validate
against that tool's ``parameters``). ``Collected`` gathers the answer from stream deltas or
a whole body; ``Schemas.check`` gives one ``(kind, result)`` per choice or tool call.

Results: ``valid``; ``invalid_json`` (does not parse, or a JSON object was asked for and
something else came); ``schema_mismatch``; ``truncated`` (did not validate, and the answer
was cut by ``max_tokens``: the request's budget, not the model's fault); ``unknown_tool``;
``unchecked`` (the schema itself does not compile, or it needs a remote document).

Client schemas are untrusted: they are compiled by jsonschema-rs (Rust; ~0.4 us a
validation and ~11 us a compile on the development machine) with a linear-time regex
engine and no remote or file ``$ref`` (the retriever refuses every one), and compiled
validators are kept in a bounded LRU by the schema's canonical bytes. Pure apart from that
cache: no I/O, no clock.

Explained for operators, with its numbers, in docs/observability.md ("Metrics").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import orjson

JSON_OBJECT = "json_object"
JSON_SCHEMA = "json_schema"
TOOL_CALL = "tool_call"
VALID = "valid"
_REGEX = jsonschema_rs.RegexOptions(size_limit=1 << 20, dfa_size_limit=1 << 20)


@dataclass(frozen=True, slots=True)
class Expectation:
    """What one request asked the answer to be. ``schema`` is the ``json_schema``'s schema;
    ``tools`` maps each offered tool's name to its ``parameters``."""

    format: str | None
    schema: object = None
    tools: Mapping[str, object] | None = None


def expect(payload: Mapping[str, Any]) -> Expectation | None:
    """None when the request asked for nothing that can be checked."""
    fmt = payload.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    schema = None
    if kind == JSON_SCHEMA:
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
    elif kind != JSON_OBJECT:
        kind = None
    tools = _tools(payload.get("tools"))
    if kind is None and tools is None:
        return None
    return Expectation(kind, schema, tools)


def _tools(offered: object) -> dict[str, object] | None:
    if not isinstance(offered, list) or not offered:
        return None
    out: dict[str, object] = {}
    for tool in offered:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out[function["name"]] = function.get("parameters")
    return out


@dataclass(frozen=True, slots=True)
class Choice:
    text: str
    calls: tuple[tuple[str, str], ...]
    finish_reason: str | None


class Collected:
    """An answer's text and tool calls per choice, from stream deltas or a whole body."""

    __slots__ = ("_calls", "_finish", "_text", "size")

    def __init__(self) -> None:
        self._text: dict[int, list[str]] = {}
        self._calls: dict[tuple[int, int], list[Any]] = {}
        self._finish: dict[int, str] = {}
        self.size = 0

    def delta(self, choice: Mapping[str, Any]) -> None:
        """One streamed choice (chat ``delta`` or completions ``text``)."""
        index = choice.get("index", 0)
        delta = choice.get("delta") or choice
        text = delta.get("content") or delta.get("text")
        if isinstance(text, str) and text:
            self._text.setdefault(index, []).append(text)
            self.size += len(text)
        for call in delta.get("tool_calls") or ():
            entry = self._calls.setdefault((index, call.get("index", 0)), ["", []])
            function = call.get("function") or {}
            if function.get("name"):
                entry[0] = function["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                entry[1].append(arguments)
                self.size += len(arguments)
        finish = choice.get("finish_reason")
        if finish:
            self._finish[index] = finish

    def body(self, answer: Mapping[str, Any]) -> None:
        """A whole ``chat.completion`` or ``text_completion`` body."""
        for choice in answer.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            message = choice.get("message")
            if isinstance(message, dict):
                calls = [
                    {"index": i, "function": c.get("function") or {}}
                    for i, c in enumerate(message.get("tool_calls") or ())
                    if isinstance(c, dict)
                ]
                shaped = {"content": message.get("content"), "tool_calls": calls}
                self.delta({**choice, "delta": shaped})
            else:
                self.delta(choice)

    def choices(self) -> list[Choice]:
        indexes = sorted(set(self._text) | {i for i, _ in self._calls} | set(self._finish))
        return [
            Choice(
                "".join(self._text.get(i, ())),
                tuple(
                    (name, "".join(parts))
                    for (c, _), (name, parts) in sorted(self._calls.items())
                    if c == i
                ),
                self._finish.get(i),
            )
            for i in indexes
        ]


class Schemas:
    """Compiled validators of client schemas, least recently used dropped first. Safe to
    share with the worker thread that checks long answers."""

    def __init__(self, max_entries: int = 256) -> None:
        self._max = max_entries
        self._cache: OrderedDict[bytes, jsonschema_rs.Validator | None] = OrderedDict()
        self._lock = threading.Lock()

    def validator(self, schema: object) -> jsonschema_rs.Validator | None:
        """None when the schema does not compile."""
        if not isinstance(schema, dict | bool):
            return None
        try:
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return None
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            compiled: jsonschema_rs.Validator | None = jsonschema_rs.validator_for(
                schema, retriever=_refuse, pattern_options=_REGEX
            )
        except (jsonschema_rs.ValidationError, ValueError, TypeError):
            compiled = None
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return compiled

    def check(self, expectation: Expectation, choices: list[Choice]) -> tuple[tuple[str, str], ...]:
        """One ``(kind, result)`` per checked choice or tool call."""
        out: list[tuple[str, str]] = []
        for choice in choices:
            truncated = choice.finish_reason == "length"
            if expectation.format is not None and not choice.calls:
                result = self._one(choice.text, expectation.schema, expectation.format)
                out.append((expectation.format, _cut(result, truncated)))
            if expectation.tools is None:
                continue
            for name, arguments in choice.calls:
                if name not in expectation.tools:
                    out.append((TOOL_CALL, "unknown_tool"))
                    continue
                result = self._one(arguments or "{}", expectation.tools[name], TOOL_CALL)
                out.append((TOOL_CALL, _cut(result, truncated)))
        return tuple(out)

    def _one(self, text: str, schema: object, kind: str) -> str:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return "invalid_json"
        if kind != JSON_SCHEMA and not isinstance(value, dict):
            return "invalid_json"  # json_object and tool arguments must be objects
        if schema is None or (kind == TOOL_CALL and schema == {}):
            return VALID
        validator = self.validator(schema)
        if validator is None:
            return "unchecked"
        return VALID if validator.is_valid(value) else "schema_mismatch"


def _cut(result: str, truncated: bool) -> str:
    return "truncated" if truncated and result not in (VALID, "unchecked") else result


def _refuse(uri: str, /) -> dict[str, Any]:
    raise ValueError(f"remote $ref not followed: {uri[:100]}")
