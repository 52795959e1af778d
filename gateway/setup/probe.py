"""Reading endpoints for ``speclane init``: their pages, and one short streamed request.

``models_of`` asks ``GET /v1/models`` and raises ``Unreachable`` with the reason when the
endpoint does not answer as an OpenAI-compatible server. ``pages_of`` then reads what the
engine shows (``/version``; the page it keeps its counters on, ``Engine.counters_page``, and
its own page, ``Engine.info_page``, for the engine the model cards' owner or the series of
``/metrics`` name; ``gateway/engines/``), sends the probe (unless told not to) and reads the
counters again. The probe is one streamed chat request of at most ``PROBE_TOKENS`` tokens at
temperature 0 (a completions request when the model has no chat template), asking for usage
and for what that engine needs to say its per-request figures (``Engine.asks``). A page an
engine hands to one reader only is never read here: it is not its counters page.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from gateway.engines import ENGINES, Engine, Registry
from gateway.setup import facts
from gateway.setup.found import Pages

PROBE_TOKENS = 24
MAX_ANSWER_BYTES = 1024 * 1024
_PROMPT = "Count from 1 to 20, numbers separated by spaces."


class Unreachable(Exception):
    """An endpoint that does not answer as an OpenAI-compatible server; says why."""


def client(timeout_s: float) -> httpx.AsyncClient:
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
    return httpx.AsyncClient(timeout=timeout, follow_redirects=False)


async def models_of(http: httpx.AsyncClient, url: str) -> facts.Models:
    """The models ``url`` serves; ``Unreachable`` says why not."""
    try:
        response = await http.get(_join(url, "/v1/models"))
    except httpx.HTTPError as exc:
        raise Unreachable(f"cannot reach {url}: {_why(exc)}") from None
    if response.status_code != 200:
        raise Unreachable(
            f"{url}/v1/models answered {response.status_code}: "
            f"is it an OpenAI-compatible server ({', '.join(ENGINES.names)})?"
        )
    try:
        return facts.models(response.content)
    except ValueError as exc:
        raise Unreachable(f"{url}/v1/models: {exc}") from None


async def pages_of(
    http: httpx.AsyncClient,
    url: str,
    found: facts.Models,
    model: str,
    *,
    probe: bool,
    engines: Registry = ENGINES,
) -> Pages:
    """Every page the engine shows, before and after the probe request."""
    version = await _version(http, url)
    owner = next((e for e in engines if found.owned_by in e.owners), None)
    counters = owner.counters_page if owner is not None else "/metrics"
    before = await _text(http, url, counters)
    engine = owner or _by_series(engines, before)
    info = None
    if engine is not None and engine.info_page is not None:
        info = await _bytes(http, url, engine.info_page)
    answer: facts.Answer | None = None
    error = None
    if probe:
        try:
            asks = engine.asks if engine is not None else {}
            answer = await _probe(http, url, model, asks)
        except Unreachable as exc:
            error = str(exc)
    after = await _text(http, url, counters) if answer is not None else None
    return Pages(url, found, version, before, after, info, answer, error)


def _by_series(engines: Registry, page: str | None) -> Engine | None:
    """The engine whose own series the page shows, if any."""
    shown = page or ""
    return next((e for e in engines if e.series is not None and e.series in shown), None)


async def _probe(
    http: httpx.AsyncClient, url: str, model: str, asks: Mapping[str, object]
) -> facts.Answer:
    chat: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_tokens": PROBE_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **asks,
    }
    status, body = await _stream(http, _join(url, "/v1/chat/completions"), chat)
    if 400 <= status < 500:  # e.g. a model without a chat template
        plain = {k: v for k, v in chat.items() if k != "messages"} | {"prompt": _PROMPT}
        status, body = await _stream(http, _join(url, "/v1/completions"), plain)
    if status != 200:
        raise Unreachable(f"answered {status}: {body[:200].decode(errors='replace')}")
    return facts.answer(body)


async def _stream(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> tuple[int, bytes]:
    try:
        async with http.stream("POST", url, json=body) as response:
            data = bytearray()
            async for part in response.aiter_bytes():
                data += part
                if len(data) > MAX_ANSWER_BYTES:
                    break
            return response.status_code, bytes(data)
    except httpx.HTTPError as exc:
        raise Unreachable(_why(exc)) from None


async def _version(http: httpx.AsyncClient, url: str) -> str | None:
    body = await _bytes(http, url, "/version")
    return facts.version(body) if body is not None else None


async def _text(http: httpx.AsyncClient, url: str, path: str) -> str | None:
    body = await _bytes(http, url, path)
    if body is None or body.lstrip().startswith((b"[", b"{")):
        return None  # absent, or not a Prometheus page
    return body.decode(errors="replace")


async def _bytes(http: httpx.AsyncClient, url: str, path: str) -> bytes | None:
    try:
        response = await http.get(_join(url, path))
    except httpx.HTTPError:
        return None
    return response.content if response.status_code == 200 else None


def _join(url: str, path: str) -> str:
    return url.rstrip("/") + path


def _why(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc or 'connection refused'})"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}"
