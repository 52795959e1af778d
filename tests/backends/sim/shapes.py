"""Shape differences between a real vLLM answer and the simulator's: every field path whose
presence or kind of value differs, SSE chunk by chunk, and Prometheus families by name,
type and label names. Values themselves (text, numbers, ids) are never compared."""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families


def kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def json_differences(real: Any, sim: Any, path: str = "$") -> list[str]:
    """Each path where ``sim`` lacks a field ``real`` has, has one it lacks, or holds
    another kind of value; lists compare their first items."""
    if kind(real) != kind(sim):
        return [f"{path}: real {kind(real)}, simulator {kind(sim)}"]
    if isinstance(real, dict):
        out = [f"{path}.{k}: missing in the simulator" for k in real if k not in sim]
        out += [f"{path}.{k}: only in the simulator" for k in sim if k not in real]
        for key in real.keys() & sim.keys():
            out += json_differences(real[key], sim[key], f"{path}.{key}")
        return sorted(out)
    if isinstance(real, list) and real and sim:
        return json_differences(real[0], sim[0], f"{path}[0]")
    return []


def events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, parsed; ``[DONE]`` as the string "[DONE]"."""
    out: list[Any] = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: "):
            data = line[6:]
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def role(event: Any) -> str:
    """What a chunk is: ``role``, ``content``, ``finish``, ``usage`` or ``done``."""
    if event == "[DONE]":
        return "done"
    choices = event.get("choices") or []
    if not choices:
        return "usage"
    if choices[0].get("finish_reason"):
        return "finish"
    if "role" in (choices[0].get("delta") or {}):
        return "role"
    return "content"


def stream_differences(real_raw: bytes, sim_raw: bytes) -> list[str]:
    """The sequence of chunk roles, then each role's first chunk, compared."""
    real, sim = events(real_raw), events(sim_raw)
    out = []
    real_roles, sim_roles = _runs([role(e) for e in real]), _runs([role(e) for e in sim])
    if real_roles != sim_roles:
        out.append(f"chunk sequence: real {real_roles}, simulator {sim_roles}")
    for name in dict.fromkeys(r for r in real_roles if r != "done"):
        mine = [e for e in sim if role(e) == name]
        theirs = next(e for e in real if role(e) == name)
        if mine:
            out += json_differences(theirs, mine[0], f"<{name} chunk>")
    return out


def _runs(roles: list[str]) -> list[str]:
    """Roles with repeats collapsed: ``content`` chunks come in runs of any length."""
    out: list[str] = []
    for r in roles:
        if not out or out[-1] != r:
            out.append(r)
    return out


def metric_families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Family name -> (type, label names of its samples, without the histogram ``le``)."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        labels = {k for s in family.samples for k in s.labels if k not in {"le", "quantile"}}
        out[family.name] = (family.type, frozenset(labels))
    return out


def metrics_differences(real_text: str, sim_text: str, needed: set[str]) -> list[str]:
    """Every family the simulator serves must be served by vLLM with the same type and
    labels, and every family in ``needed`` must be in both."""
    real, sim = metric_families(real_text), metric_families(sim_text)
    out = [f"{name}: the simulator serves it, vLLM does not" for name in sim if name not in real]
    out += [f"{name}: vLLM serves it, the simulator does not" for name in needed - sim.keys()]
    out += [f"{name}: not served by vLLM" for name in needed - real.keys()]
    for name in sim.keys() & real.keys():
        if sim[name] != real[name]:
            out.append(f"{name}: real {_show(real[name])}, simulator {_show(sim[name])}")
    return sorted(out)


def _show(family: tuple[str, frozenset[str]]) -> str:
    return f"{family[0]} {sorted(family[1])}"


def typed_events(raw: bytes) -> list[tuple[str, Any]]:
    """An SSE body of named events (Anthropic's Messages, OpenAI's Responses): each event's
    ``event:`` name and its parsed data."""
    out: list[tuple[str, Any]] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = "", None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data = "[DONE]" if line[6:] == b"[DONE]" else orjson.loads(line[6:])
        if data is not None:
            out.append((name, data))
    return out


def typed_differences(real_raw: bytes, sim_raw: bytes) -> list[str]:
    """The sequence of event names (runs of one name collapsed), then each name's first
    event, compared."""
    real, sim = typed_events(real_raw), typed_events(sim_raw)
    real_names, sim_names = _runs([n for n, _ in real]), _runs([n for n, _ in sim])
    out = []
    if real_names != sim_names:
        out.append(f"event sequence: real {real_names}, simulator {sim_names}")
    for name in dict.fromkeys(real_names):
        mine = [data for n, data in sim if n == name]
        theirs = next(data for n, data in real if n == name)
        if mine:
            out += json_differences(theirs, mine[0], f"<{name}>")
    return out
