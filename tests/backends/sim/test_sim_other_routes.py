"""The simulator's routes beside generation under uvicorn on loopback: tokens round-trip,
embeddings are deterministic unit vectors, model cards, stored responses, vLLM's 404s."""

from __future__ import annotations

import dataclasses
import math

import httpx
import pytest

from backends.sim.config import SimConfig
from backends.sim.other_routes import DIMENSIONS
from backends.sim.server import create_app
from tests.servers import serving

pytestmark = pytest.mark.anyio

CONFIG = SimConfig(served_model_names=("tiny",), time_scale=0.02)


async def test_tokens_round_trip_and_count():
    async with serving(create_app(CONFIG)) as url, httpx.AsyncClient(base_url=url) as c:
        tokenized = (await c.post("/tokenize", json={"model": "tiny", "prompt": "héllo"})).json()
        back = await c.post("/detokenize", json={"model": "tiny", "tokens": tokenized["tokens"]})
        bad = await c.post("/detokenize", json={"tokens": [256]})
    assert tokenized["count"] == len("héllo".encode()) == len(tokenized["tokens"])
    assert tokenized["max_model_len"] == CONFIG.max_model_len
    assert back.json() == {"prompt": "héllo"}
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


async def test_embeddings_are_the_same_unit_vector_for_the_same_input():
    async with serving(create_app(CONFIG)) as url, httpx.AsyncClient(base_url=url) as c:
        first = (await c.post("/v1/embeddings", json={"input": ["a", "b", "a"]})).json()
        missing = await c.post("/v1/embeddings", json={"model": "nope", "input": "a"})
    vectors = [d["embedding"] for d in first["data"]]
    assert [d["index"] for d in first["data"]] == [0, 1, 2]
    assert vectors[0] == vectors[2] != vectors[1]
    assert all(len(v) == DIMENSIONS for v in vectors)
    assert math.isclose(sum(x * x for x in vectors[1]), 1.0)
    assert first["model"] == "tiny" and first["usage"]["prompt_tokens"] == 3
    assert missing.status_code == 404


async def test_model_cards_and_unknown_paths():
    async with serving(create_app(CONFIG)) as url, httpx.AsyncClient(base_url=url) as c:
        listed = (await c.get("/v1/models")).json()["data"][0]
        card = (await c.get("/v1/models/tiny")).json()
        nope = await c.get("/v1/models/nope")
        unknown = await c.post("/v1/unknown")
    assert card["id"] == listed["id"] == "tiny" and card["object"] == "model"
    assert nope.status_code == 404
    assert unknown.status_code == 404 and unknown.json() == {"detail": "Not Found"}


async def test_stored_responses_are_read_and_cancelled():
    app = create_app(CONFIG)
    app.state.stored.store("resp_1", {"id": "resp_1", "status": "in_progress"})
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as c:
        read = await c.get("/v1/responses/resp_1")
        cancelled = await c.post("/v1/responses/resp_1/cancel")
        again = await c.post("/v1/responses/resp_1/cancel")
        missing = await c.get("/v1/responses/resp_2")
    assert read.json() == {"id": "resp_1", "status": "in_progress"}
    assert cancelled.json()["status"] == "cancelled"
    assert again.status_code == 400
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Response with id 'resp_2' not found."


async def test_delete_is_vllms_405_and_the_conversation_goes_on():
    """vLLM 0.32 has no DELETE route for a stored response: 405 in FastAPI's shape, known
    id or not, and the response stays, to be read and continued."""
    config = dataclasses.replace(CONFIG, zero_latency=True)
    async with serving(create_app(config)) as url, httpx.AsyncClient(base_url=url) as c:
        first = await c.post("/v1/responses", json={"model": "tiny", "input": "Hi", "store": True})
        response_id = first.json()["id"]
        deleted = await c.delete(f"/v1/responses/{response_id}")
        unknown = await c.delete("/v1/responses/resp_nope")
        read = await c.get(f"/v1/responses/{response_id}")
        more = {"model": "tiny", "input": "And?", "previous_response_id": response_id}
        continued = await c.post("/v1/responses", json=more)
    for answer in (deleted, unknown):
        assert answer.status_code == 405
        assert answer.json() == {"detail": "Method Not Allowed"}
        assert "GET" in answer.headers["allow"]
    assert read.status_code == 200 and read.json()["id"] == response_id
    assert continued.status_code == 200 and continued.json()["previous_response_id"] == response_id
