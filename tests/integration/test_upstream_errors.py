"""Errors vLLM finds after it opened the stream are the upstream's answer: the official openai
client gets a BadRequestError with vLLM's message, param and code, streaming or not, once (no
retries), with speclane's headers; a server error event before any content fails over."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.sim.config import SimConfig
from tests.fakes import FakeUpstream
from tests.gateways import fake_stack, sim_policy, sim_stack

pytestmark = pytest.mark.anyio

POLICY = sim_policy()
MESSAGES: Any = [{"role": "user", "content": "Extract the invoice as JSON."}]
BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}


def sim() -> SimConfig:
    return SimConfig(time_scale=0.01)


async def sim_state(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as c:
        return (await c.get(url + "/sim/state")).json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("stream", [True, False])
async def test_too_many_top_logprobs_is_the_clients_bad_request(tmp_path, stream):
    async with sim_stack(tmp_path, POLICY, sim()) as stack:
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=2)
        with pytest.raises(openai.BadRequestError) as caught:
            answer = await client.chat.completions.create(
                model="qwen3-32b", messages=MESSAGES, logprobs=True, top_logprobs=50, stream=stream
            )
            if stream:
                async for _ in answer:  # type: ignore[union-attr]
                    pass
        await client.close()
        state = await sim_state(stack.spec)
    error = caught.value
    assert error.status_code == 400 and error.code == "400" and error.param == "logprobs"
    assert error.body["message"] == (  # type: ignore[index]
        "Requested sample logprobs of 50, which is greater than max allowed: 20 "
        "(parameter=logprobs, value=50)"
    )
    headers = error.response.headers
    assert headers["x-speclane-pool"] == "spec" and headers["x-speclane-rule"] == "default"
    assert headers["x-request-id"] and headers["x-speclane-reason"]
    assert state["outcomes"]["rejected"] == 1  # asked once: a 400 is not retried
    assert stack.services.pools.healthy("spec")  # the client's mistake, not the pool's


async def test_an_invalid_json_schema_is_rejected_with_vllms_words(tmp_path):
    async with sim_stack(tmp_path, POLICY, sim()) as stack:
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="qwen3-32b", messages=MESSAGES, response_format=BAD_SCHEMA
            )
        await client.close()
    assert caught.value.message.endswith("Grammar error: Invalid type: nonsense")
    assert caught.value.param is None and caught.value.type == "BadRequestError"


def _scripted(events: list[bytes]) -> Starlette:
    """An upstream that answers 200 and then these SSE events, whatever it is asked."""

    async def answer(request: Request) -> Response:
        body = b"".join(b"data: " + e + b"\n\n" for e in events)
        return Response(body, media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])


ROLE = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "tiny",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }
)


def _error(code: int) -> bytes:
    error = {"message": "late trouble", "type": "BadRequestError", "param": "stop", "code": code}
    return orjson.dumps({"error": error})


async def test_an_error_right_after_the_role_chunk_is_still_the_answer(tmp_path):
    spec = _scripted([ROLE, _error(400), b"[DONE]"])
    std = FakeUpstream()
    async with fake_stack(tmp_path, spec, std.app()) as (url, _), httpx.AsyncClient() as c:
        streamed = await c.post(
            url + "/v1/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "stream": True},
        )
    assert streamed.status_code == 400
    assert streamed.json()["error"]["param"] == "stop"
    assert streamed.headers["content-type"] == "application/json"
    assert std.received == []


async def test_a_server_error_event_before_any_content_fails_over(tmp_path):
    spec = _scripted([_error(500), b"[DONE]"])
    std = FakeUpstream()
    async with fake_stack(tmp_path, spec, std.app()) as (url, _), httpx.AsyncClient() as c:
        answer = await c.post(
            url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES}
        )
    assert answer.status_code == 200 and answer.headers["x-speclane-pool"] == "standard"
    assert len(std.received) == 1


async def test_a_client_error_after_content_answers_a_whole_request_with_its_status(tmp_path):
    content = orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "tiny",
            "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}],
        }
    )
    spec = _scripted([ROLE, content, _error(400), b"[DONE]"])
    std = FakeUpstream()
    async with fake_stack(tmp_path, spec, std.app()) as (url, _), httpx.AsyncClient() as c:
        whole = await c.post(
            url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES}
        )
        streamed = await c.post(
            url + "/v1/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "stream": True},
        )
    assert whole.status_code == 400 and whole.json()["error"]["message"] == "late trouble"
    assert whole.headers["x-speclane-pool"] == "spec" and whole.headers["x-request-id"]
    # a streaming client already has content: the error is the stream's last event, after
    # every chunk before it, even those that came in the same read
    assert streamed.status_code == 200
    assert streamed.text.rstrip().endswith(_error(400).decode())
    assert '"content":"Hel"' in streamed.text
