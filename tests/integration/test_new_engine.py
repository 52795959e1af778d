"""A new engine is one module and one registry row: a toy engine, ``tally``, defined here
whole (the field it is asked for, how its answers say their speculation, the chunk it adds
of its own, how its pages show its counters and its load, how ``speclane init`` knows it),
registered beside the built-in engines, and a pool that names it served end to end through
a real gateway on loopback in front of a tiny real upstream that speaks it: streamed and
whole, measured the way the engine says, its counters scraped and its load page read.
The chat API is untouched: API and engine are two axes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from backends.counters import SpecCounters
from gateway.engines import ENGINES, Engine, Evidence, Said
from gateway.engines.engine import Drain, Fetch
from gateway.engines.recognition import Found, Models, Pages
from gateway.server.app import build_services, create_app
from gateway.server.connections import server_options
from gateway.services import Services
from gateway.setup.found import recognise
from policies.engines import EngineProfile
from policies.model import Engine as Named
from policies.model import Method
from policies.problems import PolicyError
from tests.gateways import settings
from tests.servers import serving

pytestmark = pytest.mark.anyio

# --- the new engine, whole: the one module ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tallied:
    """``tally``: the steps an answer took and the draft tokens it proposed and accepted."""

    steps: int
    drafted: int
    accepted: int

    @property
    def tokens_per_step(self) -> float | None:
        return None

    def said(self, tokens: int, k: int, chunk_steps: int) -> Said | None:
        return Said(self.drafted, self.accepted, min(self.steps, tokens - 1) or None)


def _tallied(answer: Mapping[str, Any]) -> Evidence | None:
    figures = answer.get("tally")
    return Tallied(**figures) if isinstance(figures, dict) else None


def _own(chunk: Mapping[str, Any]) -> bool:
    return "tally" in chunk and not chunk.get("choices")


class TallyCounters:
    """Its counters: a JSON page, ``/stats``."""

    def __init__(self, fetch: Fetch, drain: Drain) -> None:
        self._fetch = fetch

    async def read(self, url: str) -> SpecCounters:
        stats = orjson.loads(await self._fetch(url.rstrip("/") + "/stats"))
        return SpecCounters(0.0, stats["drafted"], stats["accepted"], stats["generated"])

    @property
    def lost(self) -> Mapping[str, float]:
        return {}


def _recognise(pages: Pages) -> Found | None:
    if pages.models.owned_by != "tally":
        return None
    evidence = ("model cards owned by tally",)
    name = Named("tally")
    return Found(pages.url, pages.models.ids, name, None, True, 4, None, None, evidence)


TALLY = Engine(
    name="tally",
    asks={"tally": True},
    own=_own,
    evidence=_tallied,
    whole=_tallied,
    figures=TallyCounters,
    load=frozenset({"tally_running", "tally_waiting"}),
    owners=frozenset({"tally"}),
    recognise=_recognise,
    shows=EngineProfile(
        Named("tally"), "tally", True, True, "tally counters at /stats", frozenset(Method)
    ),
)

# --- the registry row ---------------------------------------------------------------------

WITH_TALLY = ENGINES.plus(TALLY)

# --- a tiny real upstream that speaks it --------------------------------------------------

STEPS = ("one", " two three four five", " six seven eight nine")  # prefill, then two steps
USAGE = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
FIGURES = {"steps": 2, "drafted": 8, "accepted": 6}


def _chunk(**fields: Any) -> bytes:
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", **fields})


@dataclass
class Upstream:
    """What the upstream was asked, and its counters."""

    bodies: list[dict[str, Any]]
    pages: list[str]
    drafted: int = 0
    accepted: int = 0
    generated: int = 0


def tally_upstream(seen: Upstream) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.bodies.append(body)
        seen.drafted += FIGURES["drafted"]
        seen.accepted += FIGURES["accepted"]
        seen.generated += USAGE["completion_tokens"]
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(STEPS)}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            whole = {"id": "c1", "object": "chat.completion", "choices": [choice]}
            return Response(orjson.dumps(whole | {"usage": USAGE, "tally": FIGURES}))

        async def chunks() -> AsyncIterator[bytes]:
            for i, text in enumerate(STEPS):
                finish = "stop" if i == len(STEPS) - 1 else None
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
                yield _chunk(choices=[choice]) + b"\n\n"
            if body.get("tally") is True:  # asked: its figures in a chunk of its own
                yield _chunk(choices=[], tally=FIGURES) + b"\n\n"
            yield _chunk(choices=[], usage=USAGE) + b"\n\ndata: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def stats(request: Request) -> Response:
        seen.pages.append("/stats")
        counts = {"drafted": seen.drafted, "accepted": seen.accepted}
        return Response(orjson.dumps(counts | {"generated": seen.generated}))

    async def metrics(request: Request) -> Response:
        seen.pages.append("/metrics")
        page = "# TYPE tally_running gauge\ntally_running 2\n"
        return PlainTextResponse(page + "# TYPE tally_waiting gauge\ntally_waiting 1\n")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/stats", stats),
            Route("/metrics", metrics),
        ]
    )


POLICY = """
version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: ["{spec}"],
         engine: tally}}
  standard: {{kind: standard, model: tiny, endpoints: ["{std}"], engine: tally}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""


@asynccontextmanager
async def tally_gateway(tmp_path: Any) -> AsyncIterator[tuple[str, Services, Upstream]]:
    seen, other = Upstream([], []), Upstream([], [])
    async with serving(tally_upstream(seen)) as spec, serving(tally_upstream(other)) as std:
        configured = settings(tmp_path, POLICY.format(spec=spec, std=std))
        services = build_services(configured, engines=WITH_TALLY)
        app = create_app(configured, services)
        async with serving(app, **server_options(configured)) as url:
            yield url, services, seen


def _data(answer: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[6:] for line in answer.text.split("\n\n") if line.startswith("data: ")]
    return [orjson.loads(line) for line in lines if line != "[DONE]"]


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "count"}]}


async def test_a_registered_engine_is_asked_read_and_measured_through_a_real_gateway(tmp_path):
    async with tally_gateway(tmp_path) as (url, services, seen), httpx.AsyncClient() as c:
        streamed = await c.post(url + "/v1/chat/completions", json=CHAT | {"stream": True})
        asked = await c.post(
            url + "/v1/chat/completions", json=CHAT | {"stream": True, "tally": True}
        )
        whole = await c.post(url + "/v1/chat/completions", json=CHAT)
        ready = await c.get(url + "/readyz")
        records = services.outcomes.recent()
    assert streamed.status_code == asked.status_code == whole.status_code == 200
    assert {r.headers["x-speclane-pool"] for r in (streamed, asked, whole)} == {"spec"}
    # a stream to its speculative pool asks for its figures, on the gateway's account
    assert [b.get("tally") for b in seen.bodies] == [True, True, None]
    assert not any("tally" in chunk for chunk in _data(streamed))  # its own chunk dropped
    assert [c["tally"] for c in _data(asked) if "tally" in c] == [FIGURES]  # asked for: kept
    # the whole answer passes through untouched (an answer assembled from its stream would
    # not be its own: ``assembles`` is False)
    assert whole.json()["tally"] == FIGURES and "stream" not in seen.bodies[2]
    # the three answers (a mirror the guardrail may send to learn the standard pool's step
    # time is another record)
    answers = [r for r in records if not r["shadow"]]
    measured = [(r["signal"], r["drafted"], r["accepted"], r["steps"]) for r in answers]
    assert measured == [("per_request", 8, 6, 2)] * 3  # streamed or whole, as it says
    described = ready.json()["pools"]["spec"]
    assert (described["engine"], described["signal"]) == ("tally", "per_request")
    assert described["per_request_field"] == "tally"


async def test_a_registered_engines_pages_are_scraped_its_way(tmp_path):
    async with tally_gateway(tmp_path) as (url, services, seen), httpx.AsyncClient() as c:
        await services.scraper.scrape()  # a reading before the answer
        await c.post(url + "/v1/chat/completions", json=CHAT | {"stream": True})
        await services.scraper.scrape()
        assert services.load_scraper is not None
        await services.load_scraper.scrape()
    latest = services.scraper.latest["spec"]
    assert (latest.draft_tokens, latest.accepted_tokens) == (8, 6)  # its counters, differenced
    assert "/metrics" in seen.pages  # its load page, read for the series it names


async def test_init_recognises_it_and_a_gateway_without_it_refuses_it(tmp_path):
    pages = Pages("http://t:1", Models(("tiny",), "tally"))
    found = recognise(pages, WITH_TALLY)
    assert (found.engine, found.k) == ("tally", 4)
    assert recognise(pages).engine == "vllm"  # unknown to the built-in registry
    with pytest.raises(PolicyError, match="engine tally is not one this gateway has"):
        build_services(settings(tmp_path, POLICY.format(spec="http://a", std="http://b")))
