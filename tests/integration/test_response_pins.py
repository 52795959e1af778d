"""Calls naming a stored response go to the endpoint that stored it, on real sockets: a GET,
DELETE or cancel through the gateway reaches the one simulator of a two-endpoint pool that
holds the response, however the pool's load would choose; an id the gateway cannot place,
or whose endpoint left the pools, gets vLLM's own 404; and two gateways sharing a real
Redis see each other's pins."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.services import Services
from tests.gateways import gateway, settings
from tests.redis_server import namespace, require_shared_redis
from tests.servers import free_port, serving

pytestmark = pytest.mark.anyio

STORED = {"id": "resp_b1", "object": "response", "status": "completed", "output": []}


def policy(spec: str, standard: list[str]) -> str:
    return f"""
version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: tiny, endpoints: {standard},
             timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 5, total_s: 10}}}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""


class Pool(NamedTuple):
    spec: str
    a: str
    b: str
    b_app: Starlette


def sim() -> Starlette:
    return sim_app(SimConfig(mode=Mode.STANDARD, served_model_names=("tiny",), time_scale=0.01))


@asynccontextmanager
async def pool() -> AsyncIterator[Pool]:
    """A speculative simulator and a standard pool of two; the response is stored on b."""
    b_app = sim()
    b_app.state.stored.store(STORED["id"], STORED)
    async with serving(sim()) as spec, serving(sim()) as a, serving(b_app) as b:
        yield Pool(spec, a, b, b_app)


@asynccontextmanager
async def gateway_before(
    tmp: Path, sims: Pool, **overrides: Any
) -> AsyncIterator[tuple[str, Services]]:
    text = policy(sims.spec, [sims.a, sims.b])
    async with gateway(settings(tmp, text, **overrides)) as running:
        yield running


async def test_a_pinned_response_is_read_from_its_endpoint_alone(tmp_path):
    async with pool() as sims, gateway_before(tmp_path, sims) as (url, services):
        await services.pins.remember("resp_b1", sims.b)
        async with httpx.AsyncClient() as c:
            direct = await c.get(sims.b + "/v1/responses/resp_b1")
            answers = [await c.get(url + "/v1/responses/resp_b1") for _ in range(6)]
            await services.pins.remember("resp_b1", sims.a)  # where it is not
            elsewhere = await c.get(url + "/v1/responses/resp_b1")
            elsewhere_direct = await c.get(sims.a + "/v1/responses/resp_b1")
    assert direct.status_code == 200
    for answer in answers:
        assert (answer.status_code, answer.content) == (200, direct.content)
        assert answer.headers["x-speclane-pool"] == "standard"
        assert answer.headers["x-speclane-reason"] == f"pinned: response resp_b1 on {sims.b}"
    # the endpoint it was pinned to answered for itself, whatever the other one holds
    assert (elsewhere.status_code, elsewhere.content) == (404, elsewhere_direct.content)


async def test_delete_and_cancel_go_to_the_pinned_endpoint(tmp_path):
    async with pool() as sims, gateway_before(tmp_path, sims) as (url, services):
        sims.b_app.state.stored.store(
            "resp_b2", STORED | {"id": "resp_b2", "status": "in_progress"}
        )
        for response_id in ("resp_b1", "resp_b2"):
            await services.pins.remember(response_id, sims.b)
        async with httpx.AsyncClient() as c:
            completed = await c.post(url + "/v1/responses/resp_b1/cancel")
            cancelled = await c.post(url + "/v1/responses/resp_b2/cancel")
            deleted = await c.delete(url + "/v1/responses/resp_b1")
            gone = await c.get(url + "/v1/responses/resp_b1")
    assert completed.status_code == 400  # the engine's own answer: nothing to cancel
    assert completed.json()["error"]["message"] == "Cannot cancel a synchronous response."
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert deleted.json() == {"id": "resp_b1", "object": "response.deleted", "deleted": True}
    assert gone.status_code == 404
    assert gone.json()["error"]["message"] == "Response with id 'resp_b1' not found."


async def test_an_id_the_gateway_cannot_place_gets_vllms_404(tmp_path):
    async with pool() as sims, gateway_before(tmp_path, sims) as (url, services):
        await services.pins.remember("resp_moved", "http://127.0.0.1:9/")  # left the pools
        async with httpx.AsyncClient() as c:
            direct = await c.get(sims.a + "/v1/responses/resp_unknown")
            unknown = await c.get(url + "/v1/responses/resp_unknown")
            moved = await c.delete(url + "/v1/responses/resp_moved")
            cancel = await c.post(url + "/v1/responses/resp_unknown/cancel")
    assert direct.status_code == unknown.status_code == 404
    assert unknown.content == direct.content
    assert unknown.json()["error"] == {
        "message": "Response with id 'resp_unknown' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    assert moved.status_code == 404 and "resp_moved" in moved.json()["error"]["message"]
    assert cancel.status_code == 404


async def test_a_pinned_endpoint_that_does_not_answer_is_not_replaced(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    async with serving(sim()) as spec, serving(sim()) as a:
        text = policy(spec, [a, dead])
        async with gateway(settings(tmp_path, text)) as (url, services):
            await services.pins.remember("resp_x", dead)
            async with httpx.AsyncClient() as c:
                answer = await c.get(url + "/v1/responses/resp_x")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "no_healthy_upstream"
    assert answer.headers["x-speclane-pool"] == "standard"


@pytest.mark.redis
async def test_two_gateways_sharing_redis_see_each_others_pins(tmp_path):
    redis_url, ns = require_shared_redis(), namespace()
    shared = {"redis_url": redis_url, "namespace": ns}
    async with pool() as sims:
        first, second = tmp_path / "one", tmp_path / "two"
        first.mkdir(), second.mkdir()
        async with (
            gateway_before(first, sims, **shared) as (_, one),
            gateway_before(second, sims, **shared) as (url, _),
        ):
            await one.pins.remember("resp_b1", sims.b)
            async with httpx.AsyncClient() as c:
                answer = await c.get(url + "/v1/responses/resp_b1")
    raw = aioredis.from_url(redis_url)
    stored = await raw.get(f"{ns}:pin:resp_b1")
    await raw.delete(f"{ns}:pin:resp_b1")
    await raw.aclose()
    assert stored == sims.b.encode()
    assert answer.status_code == 200 and answer.json() == STORED
    assert answer.headers["x-speclane-reason"] == f"pinned: response resp_b1 on {sims.b}"


async def test_an_endpoint_a_reload_removed_no_longer_answers_for_its_responses(tmp_path):
    async with pool() as sims, gateway_before(tmp_path, sims) as (url, services):
        await services.pins.remember("resp_b1", sims.b)
        async with httpx.AsyncClient() as c:
            before = await c.get(url + "/v1/responses/resp_b1")
            services.policy.path.write_text(policy(sims.spec, [sims.a]))
            assert (await services.policy.reload()).changed
            after = await c.get(url + "/v1/responses/resp_b1")
    assert before.status_code == 200
    assert after.status_code == 404
    assert after.json()["error"]["message"] == "Response with id 'resp_b1' not found."


async def test_a_two_turn_conversation_stays_on_the_endpoint_of_its_first_turn(tmp_path):
    # the openai client's responses.create, through the gateway, on a pool of two endpoints:
    # every later turn goes where the turn before it was stored, never to the other one
    async with pool() as sims:
        text = policy(sims.spec, [sims.a, sims.b]).replace("start: spec", "start: standard")
        async with (
            gateway(settings(tmp_path, text)) as (url, services),
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client,
        ):
            await two_turns(client, services, sims)


async def two_turns(client: openai.AsyncOpenAI, services: Services, sims: Pool) -> None:
    """Five turns, each continuing the one before it."""
    first = await client.responses.with_raw_response.create(
        model="tiny", input="Hello there.", max_output_tokens=8
    )
    stored_on = await services.pins.where(first.parse().id)
    assert stored_on in (sims.a, sims.b)
    previous, turns = first.parse(), []
    for _ in range(4):
        turn = await client.responses.with_raw_response.create(
            model="tiny",
            input="And then?",
            previous_response_id=previous.id,
            max_output_tokens=8,
        )
        previous = turn.parse()
        turns.append(turn.headers["x-speclane-reason"])
        assert await services.pins.where(previous.id) == stored_on
    assert all(reason.endswith(f" on {stored_on}") for reason in turns), turns
    opening = first.parse().usage
    assert previous.usage is not None and opening is not None
    assert previous.usage.input_tokens > opening.input_tokens  # the history came along
