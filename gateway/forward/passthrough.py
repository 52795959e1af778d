"""Whether a client's non-streaming request goes upstream as it is, its answer passing through
untouched, or streamed and assembled (``gateway/forward/assemble.py``). Part of step 5.

The pool's own answer is always right; assembly exists for one purpose, the chunk signal
(tokens per streamed chunk) on speculative pools that report nothing per request. So:

- a request whose whole answer a stream cannot reproduce exactly passes through, whatever
  the pool (``stream_cannot_carry``): vLLM answers ``n > 1``, ``prompt_logprobs``, ``echo``,
  beam search, several prompts and tool calls (its tool parsers read a whole answer and a
  stream differently, above all one cut by ``max_tokens``) differently when streamed;
- a standard pool has nothing to measure per request: pass through;
- a speculative pool passes through once its answers are seen to say their speculation per
  request, as its engine reads them (``PerRequestReports``; vLLM's
  ``metrics.speculative_decoding``), and goes back to assembly when one does not;
- a speculative pool of an engine whose answers assembly does not reproduce field by field
  passes through (``Engine.assembles``, ``gateway/engines/``);
- the pool's ``passthrough_non_streaming`` overrides the last three.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.engines import ENGINES, Registry
from policies.model import Pool, PoolKind


class PerRequestReports:
    """Which pools' answers say their speculation per request, as last seen."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, bool] = {}

    def saw(self, pool: str, reported: bool) -> None:
        """An answer (or final usage chunk) of ``pool`` to an ``n == 1`` request said its
        speculation (``reported``), or did not."""
        self._seen[pool] = reported

    def reports(self, pool: str) -> bool:
        return self._seen.get(pool, False)

    def known(self) -> dict[str, bool]:
        return dict(self._seen)


def one_answer(payload: Mapping[str, Any]) -> bool:
    """One prompt, one choice: what per-request metrics and the chunk signal describe."""
    if _count(payload.get("n")) > 1 or _count(payload.get("best_of")) > 1:
        return False
    prompt = payload.get("prompt")
    several = isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int)
    return not several


def stream_cannot_carry(payload: Mapping[str, Any]) -> str | None:
    """Why a streamed answer would differ from the whole one, or ``None``."""
    if not one_answer(payload):
        return "several answers"
    for name in ("prompt_logprobs", "stream_options"):
        if payload.get(name) is not None:
            return name
    if payload.get("echo") or payload.get("use_beam_search"):
        return "echo" if payload.get("echo") else "use_beam_search"
    if payload.get("tools") and payload.get("tool_choice", "auto") != "none":
        return "tool calls"
    return None


def stream_options(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What to ask of upstream for a streamed answer: usage always (per-request metrics ride
    on it); the client's other options kept, but running usage in every chunk only when the
    client asked for usage itself (vLLM ignores it without ``include_usage``)."""
    asked = payload.get("stream_options")
    options = dict(asked) if isinstance(asked, Mapping) else {}
    if options.get("include_usage") is not True:
        options.pop("continuous_usage_stats", None)
    return options | {"include_usage": True}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def passes_through(
    name: str,
    pool: Pool,
    reports: PerRequestReports,
    payload: Mapping[str, Any],
    engines: Registry = ENGINES,
) -> bool:
    """Whether a non-streaming request the decision sends to ``pool`` goes upstream whole
    (``engines``: the engine the pool names among them)."""
    if stream_cannot_carry(payload) is not None:
        return True
    if pool.passthrough_non_streaming is not None:
        return pool.passthrough_non_streaming
    if pool.kind is PoolKind.STANDARD or not engines.of(pool.engine).assembles:
        return True
    return reports.reports(name)
