"""What a client asks a vLLM server about itself, through the gateway on real sockets:
``GET /v1/models`` (each model's card as its pools list it, read by the ``openai`` SDK),
``GET /version`` and ``GET /health``, each answered as the simulator answers it directly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import openai
import pytest

from gateway.identity import key_hash
from gateway.server.relayed import LIST_WAIT_S
from tests.gateways import gateway, settings
from tests.integration.test_other_routes import policy, sims

pytestmark = pytest.mark.anyio

MODEL = "tiny"


async def test_the_model_list_shows_each_card_as_the_pools_list_it(tmp_path):
    async with sims(tmp_path) as stack, httpx.AsyncClient() as c:
        via = await c.get(stack.url + "/v1/models")
        direct = await c.get(stack.standard + "/v1/models")
        sdk = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", http_client=c)
        cards = [card.model_dump() async for card in sdk.models.list()]
    assert via.status_code == 200
    assert via.headers["content-type"] == direct.headers["content-type"]
    assert via.json() == direct.json()
    assert [(card["id"], card["owned_by"], card["max_model_len"]) for card in cards] == [
        (MODEL, "vllm", 2048)
    ]


async def test_a_model_no_pool_lists_keeps_the_gateways_own_card(tmp_path, closed_port):
    dead = f"http://127.0.0.1:{closed_port()}"
    async with (
        gateway(settings(tmp_path, policy([dead], [dead]))) as (url, _),
        httpx.AsyncClient() as c,
    ):
        listed = await c.get(url + "/v1/models")
    assert listed.status_code == 200
    (card,) = listed.json()["data"]
    assert (card["id"], card["object"], card["owned_by"]) == (MODEL, "model", "speclane")


@asynccontextmanager
async def silent() -> AsyncIterator[str]:
    """An endpoint that takes connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        for writer in held:
            writer.close()
        server.close()


async def test_a_stalled_pool_never_holds_the_model_list(tmp_path):
    """Its pools take the request and say nothing until their own timeouts (10 s here):
    the list answers within ``LIST_WAIT_S`` with the gateway's own card."""
    async with (
        silent() as stalled,
        gateway(settings(tmp_path, policy([stalled], [stalled]))) as (url, _),
        httpx.AsyncClient(timeout=30) as c,
    ):
        listed = await asyncio.wait_for(c.get(url + "/v1/models"), LIST_WAIT_S + 5)
    assert listed.status_code == 200
    assert listed.json()["data"][0]["owned_by"] == "speclane"


async def test_the_model_list_needs_a_key_where_requests_do(tmp_path):
    extra = f"tenants: {{acme: {{api_keys: ['{key_hash('sk-acme')}']}}}}"
    async with (
        sims(tmp_path, extra, require_api_key=True) as stack,
        httpx.AsyncClient() as c,
    ):
        none = await c.get(stack.url + "/v1/models")
        keyed = await c.get(stack.url + "/v1/models", headers={"authorization": "Bearer sk-acme"})
    assert none.status_code == 401
    assert keyed.status_code == 200 and keyed.json()["data"][0]["owned_by"] == "vllm"


async def test_version_and_health_answer_as_the_engine_does(tmp_path):
    async with sims(tmp_path) as stack, httpx.AsyncClient() as c:
        answers = {}
        for path in ("/version", "/health"):
            via = await c.get(stack.url + path)
            direct = await c.get(stack.standard + path)
            answers[path] = via
            assert (via.status_code, via.content) == (direct.status_code, direct.content), path
        assert stack.services is not None
        stack.services.gate.draining = True
        draining = await c.get(stack.url + "/health")
        stack.services.gate.draining = False
    assert answers["/version"].headers["x-speclane-pool"] == "standard"
    assert answers["/version"].json() == {"version": "0.32.0"}
    assert answers["/health"].status_code == 200 and answers["/health"].content == b""
    assert draining.status_code == 503
