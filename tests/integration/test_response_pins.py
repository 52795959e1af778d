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

import anyio
import httpx
import openai
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.identity import key_hash
from gateway.services import Services
from policies.model import ANONYMOUS
from tests.gateways import gateway, settings
from tests.redis_server import namespace, require_shared_redis
from tests.servers import serving

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
        await services.pins.remember(ANONYMOUS, "resp_b1", sims.b)
        async with httpx.AsyncClient() as c:
            direct = await c.get(sims.b + "/v1/responses/resp_b1")
            answers = [await c.get(url + "/v1/responses/resp_b1") for _ in range(6)]
            await services.pins.remember(ANONYMOUS, "resp_b1", sims.a)  # where it is not
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
            await services.pins.remember(ANONYMOUS, response_id, sims.b)
        async with httpx.AsyncClient() as c:
            completed = await c.post(url + "/v1/responses/resp_b1/cancel")
            cancelled = await c.post(url + "/v1/responses/resp_b2/cancel")
            deleted = await c.delete(url + "/v1/responses/resp_b1")
            kept = await c.get(url + "/v1/responses/resp_b1")
    assert completed.status_code == 400  # the engine's own answer: nothing to cancel
    assert completed.json()["error"]["message"] == "Cannot cancel a synchronous response."
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    # vLLM 0.32 has no DELETE for a stored response: its 405 reaches the client from the
    # endpoint that holds it, and the response is still there
    assert deleted.status_code == 405 and deleted.json() == {"detail": "Method Not Allowed"}
    assert deleted.headers["x-speclane-reason"] == f"pinned: response resp_b1 on {sims.b}"
    assert kept.status_code == 200 and kept.json()["id"] == "resp_b1"


async def test_an_id_the_gateway_cannot_place_gets_vllms_404(tmp_path):
    async with pool() as sims, gateway_before(tmp_path, sims) as (url, services):
        await services.pins.remember(
            ANONYMOUS, "resp_moved", "http://127.0.0.1:9/"
        )  # left the pools
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


async def test_a_pinned_endpoint_that_does_not_answer_is_not_replaced(tmp_path, closed_port):
    dead = f"http://127.0.0.1:{closed_port()}"
    async with serving(sim()) as spec, serving(sim()) as a:
        text = policy(spec, [a, dead])
        async with gateway(settings(tmp_path, text)) as (url, services):
            await services.pins.remember(ANONYMOUS, "resp_x", dead)
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
            await one.pins.remember(ANONYMOUS, "resp_b1", sims.b)
            async with httpx.AsyncClient() as c:
                answer = await c.get(url + "/v1/responses/resp_b1")
    raw = aioredis.from_url(redis_url)
    stored = await raw.get(f"{ns}:pin:{{anonymous}}:resp_b1")
    await raw.delete(f"{ns}:pin:{{anonymous}}:resp_b1", f"{ns}:pins:{{anonymous}}")
    await raw.aclose()
    assert stored == sims.b.encode()
    assert answer.status_code == 200 and answer.json() == STORED
    assert answer.headers["x-speclane-reason"] == f"pinned: response resp_b1 on {sims.b}"


async def test_an_endpoint_a_reload_removed_no_longer_answers_for_its_responses(tmp_path):
    async with pool() as sims, gateway_before(tmp_path, sims) as (url, services):
        await services.pins.remember(ANONYMOUS, "resp_b1", sims.b)
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
    stored_on = await services.pins.where(ANONYMOUS, first.parse().id)
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
        assert await services.pins.where(ANONYMOUS, previous.id) == stored_on
    assert all(reason.endswith(f" on {stored_on}") for reason in turns), turns
    opening = first.parse().usage
    assert previous.usage is not None and opening is not None
    assert previous.usage.input_tokens > opening.input_tokens  # the history came along


TENANTS = f"""
tenants:
  acme: {{api_keys: ["{key_hash("sk-acme")}"]}}
  beta: {{api_keys: ["{key_hash("sk-beta")}"]}}
"""


def keyed(sims: Pool) -> str:
    return policy(sims.spec, [sims.a, sims.b]).replace("ladder:", TENANTS + "ladder:")


def client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


async def calls_by(url: str, response_id: str, headers: dict[str, str]) -> list[httpx.Response]:
    """Every call that names a stored response, as ``headers`` make them."""
    continued = {"model": "tiny", "input": "And?", "previous_response_id": response_id}
    async with httpx.AsyncClient(headers=headers) as c:
        return [
            await c.get(f"{url}/v1/responses/{response_id}"),
            await c.post(f"{url}/v1/responses/{response_id}/cancel"),
            await c.delete(f"{url}/v1/responses/{response_id}"),
            await c.post(f"{url}/v1/responses", json=continued),
        ]


@pytest.mark.redis
async def test_a_stored_response_is_its_tenants_alone_on_every_replica(tmp_path):
    redis_url, ns = require_shared_redis(), namespace()
    shared = {"redis_url": redis_url, "namespace": ns}
    async with pool() as sims:
        first, second = tmp_path / "one", tmp_path / "two"
        first.mkdir(), second.mkdir()
        async with (
            gateway(settings(first, keyed(sims), **shared)) as (one, _),
            gateway(settings(second, keyed(sims), **shared)) as (two, _),
            client(one, "sk-acme") as acme,
            client(two, "sk-acme") as acme_elsewhere,
            client(two, "sk-beta") as beta,
        ):
            stored = await acme.responses.create(model="tiny", input="Hi.", max_output_tokens=8)
            unknown = await calls_by(two, "resp_never_stored", {})
            others = [
                await calls_by(two, stored.id, {"authorization": "Bearer sk-beta"}),
                await calls_by(two, stored.id, {"x-api-key": "sk-beta"}),
                await calls_by(two, stored.id, {}),
                await calls_by(two, stored.id, {"authorization": "Bearer sk-nobody"}),
                await calls_by(one, stored.id, {"authorization": "Bearer sk-beta"}),
            ]
            with pytest.raises(openai.NotFoundError):
                await beta.responses.retrieve(stored.id)
            with pytest.raises(openai.NotFoundError):
                await beta.responses.create(
                    model="tiny", input="More.", previous_response_id=stored.id
                )
            read = await acme_elsewhere.responses.retrieve(stored.id)
            turn = await acme_elsewhere.responses.create(
                model="tiny", input="More.", previous_response_id=stored.id, max_output_tokens=8
            )
    await forget(redis_url, ns)
    expected = [(404, r.content.replace(b"resp_never_stored", stored.id.encode())) for r in unknown]
    assert [r.status_code for r in unknown] == [404] * 4
    for answers in others:  # the very bytes of an id never stored
        assert [(r.status_code, r.content) for r in answers] == expected
    assert read.id == stored.id and turn.status in ("completed", "incomplete")


async def test_a_client_cannot_name_the_id_its_response_is_stored_under(tmp_path):
    # vLLM stores a Responses answer under the body's request_id: beta naming acme's id would
    # replace acme's stored response on the engine and be pinned as beta's, for beta to read
    async with (
        pool() as sims,
        gateway(settings(tmp_path, keyed(sims))) as (url, _),
        client(url, "sk-acme") as acme,
        client(url, "sk-beta") as beta,
    ):
        stored = await acme.responses.create(model="tiny", input="Hi.", max_output_tokens=8)
        before = await acme.responses.retrieve(stored.id)
        named = {"request_id": stored.id}
        taken = await beta.responses.create(
            model="tiny", input="Mine.", max_output_tokens=8, extra_body=named
        )
        after = await acme.responses.retrieve(stored.id)
        theirs = await calls_by(url, stored.id, {"authorization": "Bearer sk-beta"})
    assert taken.id != stored.id
    assert after.model_dump() == before.model_dump()
    assert [r.status_code for r in theirs] == [404] * 4


async def test_required_keys_guard_every_call_to_a_stored_response(tmp_path):
    async with pool() as sims:
        text = keyed(sims)
        async with gateway(settings(tmp_path, text, require_api_key=True)) as (url, _):
            async with client(url, "sk-acme") as acme:
                stored = await acme.responses.create(model="tiny", input="Hi.", max_output_tokens=8)
            keyless = await calls_by(url, stored.id, {})
            unknown = await calls_by(url, stored.id, {"authorization": "Bearer sk-nobody"})
            beta = await calls_by(url, stored.id, {"authorization": "Bearer sk-beta"})
            acme_reads = await calls_by(url, stored.id, {"authorization": "Bearer sk-acme"})
    for answer in keyless + unknown:
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_api_key"
    assert [r.status_code for r in beta] == [404] * 4
    assert acme_reads[0].status_code == 200 and acme_reads[0].json()["id"] == stored.id


async def forget(url: str, ns: str) -> None:
    raw = aioredis.from_url(url)
    keys = [key async for key in raw.scan_iter(match=f"{ns}:*", count=1000)]
    if keys:
        await raw.delete(*keys)
    await raw.aclose()


async def test_a_pin_redis_does_not_take_is_counted_and_still_known_here(tmp_path, closed_port):
    down = f"redis://127.0.0.1:{closed_port()}/0"  # nothing listens there
    async with pool() as sims:
        text = policy(sims.spec, [sims.a, sims.b])
        async with (
            gateway(settings(tmp_path, text, redis_url=down)) as (url, _),
            client(url, "unused") as anyone,
        ):
            stored = await anyone.responses.create(model="tiny", input="Hi.", max_output_tokens=8)
            async with httpx.AsyncClient() as c:
                for _ in range(100):
                    metrics = (await c.get(url + "/metrics")).text
                    if DROPPED in metrics:
                        break
                    await anyio.sleep(0.05)
            read = await anyone.responses.retrieve(stored.id)
    assert DROPPED in metrics
    assert read.id == stored.id  # this replica remembers it itself


DROPPED = 'speclane_response_pin_writes_dropped_total{reason="redis_error"} 1.0'
