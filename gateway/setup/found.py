"""What ``speclane init`` concludes about one endpoint from its pages, and what it tells the
operator to check. Pure: the pages come in read (``gateway/setup/probe.py``).

Each engine recognises its own (``Engine.recognise``, ``gateway/engines/``): by the model
cards' owner, the series of its ``/metrics`` page, its own pages and the probe's answer;
whether it speculates and its k come from what the engine keeps, whether answers carry
per-request acceptance from the probe's answer. The engines are asked in the registry's
order after its first, which takes every OpenAI-compatible server no other recognised.
"""

from __future__ import annotations

from gateway.engines import ENGINES, Registry
from gateway.engines.recognition import Found, Pages

__all__ = ["Found", "Pages", "advice", "recognise"]


def recognise(pages: Pages, engines: Registry = ENGINES) -> Found:
    """The engine, speculation, k and per-request metrics of one endpoint."""
    first, *others = engines
    for engine in others:
        found = engine.recognise(pages)
        if found is not None:
            return found
    taken = first.recognise(pages)
    if taken is None:
        raise ValueError(f"{pages.url}: no engine recognises it")
    return taken


def advice(found: Found, role: str, engines: Registry = ENGINES) -> list[str]:
    """What the operator should know or do about this endpoint, one line each."""
    out = []
    if role == "spec" and found.speculates is False:
        out.append(f"{found.url} was given as speculative but does not speculate")
    if role == "standard" and found.speculates:
        out.append(f"{found.url} was given as standard but speculates: check its flags")
    if role == "spec":
        out.extend(engines.of(found.engine).advice(found))
    return out
