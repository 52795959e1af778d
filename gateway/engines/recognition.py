"""What ``speclane init`` reads from one endpoint (``Pages``) and concludes (``Found``), in
the shapes every engine's ``recognise`` shares; the pages are fetched by
``gateway/setup/probe.py`` and read by the engine modules. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from policies.model import Engine, Method


@dataclass(frozen=True, slots=True)
class Models:
    """``GET /v1/models``: the names served and who the cards say owns them."""

    ids: tuple[str, ...]
    owned_by: str
    roots: tuple[str, ...] = ()  # each card's root: vLLM's --model, a directory or a Hub id


@dataclass(frozen=True, slots=True)
class Answer:
    """What the probe's streamed answer carried: content chunks, output tokens, whether it
    said its speculation per request, and tokens per step where it said those instead."""

    chunks: int = 0
    tokens: int = 0
    per_request: bool = False
    tokens_per_step: float | None = None

    @property
    def tokens_per_chunk(self) -> float | None:
        return self.tokens / self.chunks if self.chunks and self.tokens else None


@dataclass(frozen=True, slots=True)
class Pages:
    """Everything read from one endpoint; None where a page was not there or not read.
    ``metrics``: the page the engine keeps its counters on (``Engine.counters_page``),
    before and after the probe; ``info``: the engine's own page (``Engine.info_page``)."""

    url: str
    models: Models
    version: str | None = None
    metrics: str | None = None
    metrics_after: str | None = None
    info: bytes | None = None
    answer: Answer | None = None  # the probe's; None when not probed
    probe_error: str | None = None


@dataclass(frozen=True, slots=True)
class Found:
    """One endpoint as the starter policy needs it."""

    url: str
    models: tuple[str, ...]
    engine: Engine
    version: str | None
    speculates: bool | None  # None: cannot tell
    k: int | None
    method: Method | None
    per_request: bool | None  # None: not checked
    evidence: tuple[str, ...]


def answered(pages: Pages, test: Callable[[Answer], bool]) -> bool | None:
    """``test`` of the probe's answer; None when there was no probe."""
    return None if pages.answer is None else test(pages.answer)


def probe_evidence(pages: Pages) -> tuple[str, ...]:
    """What the probe showed, for the evidence lines."""
    if pages.probe_error is not None:
        return (f"the probe request failed: {pages.probe_error}",)
    answer = pages.answer
    if answer is None:
        return ()
    per_chunk = answer.tokens_per_chunk
    shown = f", {per_chunk:.2g} per chunk" if per_chunk else ""
    return (f"the probe: {answer.tokens} tokens in {answer.chunks} chunks{shown}",)


def version_at_least(found: str | None, wanted: tuple[int, ...]) -> bool | None:
    """Whether a version string is at least ``wanted`` (None when it cannot be read)."""
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", found or "")
    if parts is None:
        return None
    have = tuple(int(p) for p in parts.groups() if p is not None)
    return have >= wanted
