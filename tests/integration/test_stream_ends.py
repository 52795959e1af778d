"""How an upstream stream ends, through a real gateway on loopback: a ``[DONE]`` where the
answer has not ended, a stream that is nothing but ``[DONE]``, and a break or a stall after
an answer's last event. The upstream is a raw ``asyncio`` server here, in each API's shape
(``bench/hostile.py``'s), with a simulator as the rung below it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

from bench.faults import CHAT, COMPLETIONS, MESSAGES, RESPONSES, error_shaped, sse_events
from bench.hostile import Chat, api_of
from tests.integration.test_hostile_upstreams import sim, stack

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
BODIES = {
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8},
    COMPLETIONS: {"model": MODEL, "prompt": "Hi.", "max_tokens": 8},
    MESSAGES: {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi."}]},
    RESPONSES: {"model": MODEL, "max_output_tokens": 8, "input": "Hi."},
}
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
DONE = b"data: [DONE]\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset, not a clean end."""
    writer.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
    )
    writer.transport.abort()


async def _answer(mode: str, api: Chat, writer: asyncio.StreamWriter) -> None:
    started = api.opening() + api.delta("Hello")
    if mode == "done-early":  # a [DONE] where the answer has not ended
        writer.write(HEAD + _chunk(started + DONE) + b"0\r\n\r\n")
    elif mode == "done-only":  # nothing but [DONE]
        writer.write(HEAD + _chunk(DONE) + b"0\r\n\r\n")
    else:  # the whole answer, then a reset or a stall in place of the body's end
        writer.write(HEAD + _chunk(started + api.ending()))
        await writer.drain()
        if mode == "reset-after":
            await asyncio.sleep(0.2)
            _reset(writer)
            return
        await asyncio.sleep(30)
    await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        length = next(
            int(v) for n, _, v in (line.partition(":") for line in lines[1:])
            if n.strip().lower() == "content-length"
        )  # fmt: skip
        await reader.readexactly(length)
        await _answer(path.strip("/").split("/")[0], api_of(path), writer)
    except (OSError, asyncio.IncompleteReadError, StopIteration, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


@asynccontextmanager
async def ending() -> AsyncIterator[str]:
    """The upstream on loopback: its base URL, whose first path segment is the mode."""
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        server.close()


async def streamed(tmp_path: Any, mode: str, route: str) -> httpx.Response:
    """``route`` streamed through a gateway whose speculative pool is the upstream in
    ``mode`` and whose standard pool is a simulator."""
    async with (
        ending() as bad,
        stack(tmp_path, [f"{bad}/{mode}"], [sim(2)]) as (url, _),
        httpx.AsyncClient(timeout=30) as c,
    ):
        return await c.post(url + route, json=BODIES[route] | {"stream": True})


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
async def test_a_done_before_the_last_event_is_not_passed_on(tmp_path, route):
    """The stream ends with the API's error event, and no ``[DONE]`` comes before it: the
    ``openai`` client stops reading a Responses stream at ``[DONE]``, and would take the
    cut answer for a whole one."""
    r = await streamed(tmp_path, "done-early", route)
    assert r.status_code == 200 and r.headers["x-speclane-pool"] == "spec"
    assert b"[DONE]" not in r.content, r.content[-300:]
    name, last = sse_events(r.content)[-1]
    assert name == "error" and error_shaped(route, last), r.content[-300:]


async def test_the_openai_client_sees_the_error_of_a_responses_stream_cut_by_done(tmp_path):
    async with (
        ending() as bad,
        stack(tmp_path, [f"{bad}/done-early"], [sim(2)]) as (url, _),
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        stream = await client.responses.create(
            model=MODEL, input="Hi.", max_output_tokens=8, stream=True
        )
        events = [event async for event in stream]
    assert isinstance(events[-1], openai.types.responses.ResponseErrorEvent)
    assert events[-1].code == "upstream_stream_broken"


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS, MESSAGES, RESPONSES])
async def test_a_stream_of_nothing_but_done_is_no_answer_and_fails_over(tmp_path, route):
    """Nothing reached the client yet: the rung below serves the whole answer."""
    r = await streamed(tmp_path, "done-only", route)
    assert r.status_code == 200 and r.headers["x-speclane-pool"] == "standard"
    events = sse_events(r.content)
    if route in (CHAT, COMPLETIONS):
        assert events[-1][1] == b"[DONE]" and len(events) > 1
    else:
        assert events[-1][1]["type"] in ("message_stop", "response.completed")


@pytest.mark.parametrize("mode", ["reset-after", "stall-after"])
@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
async def test_a_break_after_the_last_event_leaves_the_answer_whole(tmp_path, route, mode):
    """A reset, or a stall past ``idle_s``, in place of the body's end: the client got the
    whole answer, and no error event after it."""
    r = await streamed(tmp_path, mode, route)
    assert r.status_code == 200 and r.headers["x-speclane-pool"] == "spec"
    name, last = sse_events(r.content)[-1]
    assert last["type"] in ("message_stop", "response.completed"), r.content[-300:]
    assert json.dumps(last)  # an event, not the bytes of a broken one
