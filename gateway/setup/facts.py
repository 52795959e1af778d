"""What one serving endpoint's own pages say about it, read without any I/O.

``speclane init`` fetches the pages (``gateway/setup/probe.py``); these functions read the
ones every engine shows: ``GET /v1/models`` (the served model names, and ``owned_by``,
each engine's own default), ``GET /version``, a model's ``generation_config.json``, and
one short streamed request (the probe), which says how many tokens each content chunk held
and what the answer says of its own speculation, as the engines read it
(``gateway/engines/``: per request, or only tokens per step). What each engine's own pages
show is read by its module there. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from gateway.engines import ENGINES, Engine
from gateway.engines.recognition import Answer, Models, version_at_least
from gateway.engines.vllm import page as vllm_page

__all__ = [
    "Answer",
    "Models",
    "answer",
    "generation_config",
    "models",
    "version",
    "version_at_least",
    "vllm_page",
]


def models(body: bytes) -> Models:
    """The served models; ``ValueError`` when the page is not an OpenAI model list."""
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    data = page.get("data") if isinstance(page, dict) else None
    cards = [card for card in data or () if isinstance(card, dict) and card.get("id")]
    if not cards:
        raise ValueError("no model in its list")
    owners = {str(card.get("owned_by", "")) for card in cards}
    roots = tuple(str(card.get("root") or "") for card in cards)
    return Models(tuple(str(card["id"]) for card in cards), sorted(owners)[0], roots)


def generation_config(body: bytes) -> dict[str, float]:
    """The sampling defaults of a model's ``generation_config.json`` (temperature, top_p)
    that vLLM applies to a request without them; {} when it sets none or is not JSON."""
    try:
        config = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(config, dict):
        return {}
    found = {name: config.get(name) for name in ("temperature", "top_p")}
    return {
        name: float(value)
        for name, value in found.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def version(body: bytes) -> str | None:
    """``GET /version``'s ``{"version": ...}``, when it is that."""
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    found = page.get("version") if isinstance(page, dict) else None
    return str(found) if isinstance(found, str | int | float) and found != "" else None


def answer(body: bytes, engines: Iterable[Engine] = ENGINES) -> Answer:
    """What a streamed answer (chat or completions, SSE) carried; what it says of its own
    speculation as any of ``engines`` reads it."""
    chunks = tokens = 0
    per_request = False
    per_step: float | None = None
    readers = [engine.evidence for engine in engines]
    for line in body.splitlines():
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
            continue
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        chunks += _content(event)
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
        for read in readers:
            said = read(event)
            if said is not None and said.tokens_per_step is not None:
                per_step = said.tokens_per_step
            elif said is not None:
                per_request = True
    return Answer(chunks, tokens, per_request, per_step)


def _content(event: dict[str, Any]) -> int:
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if text:
            return 1
    return 0
