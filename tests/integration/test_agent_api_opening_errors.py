"""Errors vLLM finds after it opened a Messages or Responses stream come after the events
it opens with (``message_start``; ``response.created``, ``response.in_progress``), as in
chat they come after the role chunk: the gateway reads past those before it sends a byte,
so a server's error fails over and a client's error is the client's answer, in the API's
shape."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.gateways import fake_stack

pytestmark = pytest.mark.anyio

START = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "content": []}}
CREATED = {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}
PROGRESS = {"type": "response.in_progress", "response": {"id": "resp_1"}}


def _named(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def _scripted(
    path: str, events: list[dict[str, Any]], asked: list[bytes] | None = None
) -> Starlette:
    """An upstream that answers 200 and these events at ``path``, noting each body in
    ``asked``."""

    async def answer(request: Request) -> Response:
        if asked is not None:
            asked.append(await request.body())
        return Response(_named(events), media_type="text/event-stream")

    return Starlette(routes=[Route(path, answer, methods=["POST"])])


FINE = {
    "/v1/messages": [START, {"type": "message_stop"}],
    "/v1/responses": [CREATED, {"type": "response.completed", "response": {"id": "resp_2"}}],
}


MESSAGES = {"model": "tiny", "max_tokens": 8, "stream": True}
MESSAGES |= {"messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "tiny", "input": "hi", "stream": True}


@pytest.mark.parametrize(
    ("path", "body", "events"),
    [
        (
            "/v1/messages",
            MESSAGES,
            [START, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}],
        ),
        (
            "/v1/responses",
            RESPONSES,
            [CREATED, PROGRESS, {"type": "error", "code": 500, "message": "engine died"}],
        ),
        (
            "/v1/responses",
            RESPONSES,
            [CREATED, {"type": "response.failed", "response": {"error": {"code": "x"}}}],
        ),
    ],
)
async def test_a_server_error_after_the_opening_events_fails_over(tmp_path, path, body, events):
    asked: list[bytes] = []
    std = _scripted(path, FINE[path], asked)
    spec = _scripted(path, events)
    async with fake_stack(tmp_path, spec, std) as (url, _), httpx.AsyncClient() as client:
        answer = await client.post(url + path, json=body)
    assert answer.status_code == 200 and answer.headers["x-speclane-pool"] == "standard"
    assert len(asked) == 1 and answer.content == _named(FINE[path])


async def test_a_client_error_after_message_start_is_the_clients_answer(tmp_path):
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad tool"}}
    asked: list[bytes] = []
    spec, std = _scripted("/v1/messages", [START, error]), _scripted("/v1/messages", [], asked)
    async with fake_stack(tmp_path, spec, std) as (url, _), httpx.AsyncClient() as client:
        answer = await client.post(url + "/v1/messages", json=MESSAGES)
    assert answer.status_code == 400
    assert answer.json() == error
    assert asked == []
