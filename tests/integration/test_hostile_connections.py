"""Hostile connections against a real gateway on loopback, served as ``speclane serve``
serves it (``gateway/server/connections.py``): oversized heads, heads and bodies trickled a
byte at a time, more connections than the cap, idle and broken connections; and normal
clients served while it goes on."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest

from tests.fakes import FakeUpstream
from tests.gateways import fake_stack

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"


@asynccontextmanager
async def _gateway(tmp_path: Any, **limits: Any) -> AsyncIterator[tuple[str, FakeUpstream]]:
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app(), **limits) as (url, _):
        yield url, fake


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _answer(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, orjson.loads(body)


async def _normal_clients(url: str, clients: int, requests: int, pause_s: float) -> list[int]:
    async def one() -> list[int]:
        statuses = []
        async with httpx.AsyncClient(timeout=10) as c:
            for _ in range(requests):
                statuses.append((await c.post(url + "/v1/chat/completions", json=CHAT)).status_code)
                await asyncio.sleep(pause_s)
        return statuses

    return [s for batch in await asyncio.gather(*(one() for _ in range(clients))) for s in batch]


async def _attack(url: str, attackers: int, one: Callable[[str, int], Awaitable[bytes]]) -> Any:
    """Run ``one`` per attacker again and again until cancelled; what each got back."""
    host, port = _address(url)
    got: list[bytes] = []

    async def loop() -> None:
        while True:
            got.append(await one(host, port))

    tasks = [asyncio.create_task(loop()) for _ in range(attackers)]
    return tasks, got


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _slow_head(host: str, port: int) -> bytes:
    """A head sent one byte every 0.1 s, for ever; what the gateway answered."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(HEAD)
        reading = asyncio.create_task(reader.read())
        while not reading.done():
            with contextlib.suppress(ConnectionError):
                writer.write(b"x")
            await asyncio.wait([reading], timeout=0.1)
        return reading.result()
    finally:
        writer.close()


async def _big_head(host: str, port: int) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(HEAD + b"x-big: " + b"a" * 256 * 1024)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await reader.read()
    finally:
        writer.close()


async def test_normal_clients_are_served_during_a_slowloris(tmp_path):
    async with _gateway(tmp_path, header_timeout_s=0.5) as (url, _):
        tasks, got = await _attack(url, 100, _slow_head)
        statuses = await _normal_clients(url, 4, 15, 0.05)
        while len(got) < 100:  # every attacker cut at least once
            await asyncio.sleep(0.1)
        await _stop(tasks)
    assert statuses == [200] * 60
    status, headers, body = _answer(got[0])
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["code"] == "request_timeout"


async def test_normal_clients_are_served_during_a_header_flood(tmp_path):
    async with _gateway(tmp_path, max_header_bytes=16 * 1024) as (url, _):
        tasks, got = await _attack(url, 20, _big_head)
        statuses = await _normal_clients(url, 4, 15, 0.02)
        await _stop(tasks)
    assert statuses == [200] * 60
    assert len(got) >= 20
    assert {_answer(raw)[0] for raw in got} == {431}


async def test_an_oversized_head_is_a_431_in_bounded_memory(tmp_path):
    async with _gateway(tmp_path, max_header_bytes=16 * 1024) as (url, _):
        reader, writer = await asyncio.open_connection(*_address(url))
        before = _rss_mib()
        sent = 0

        async def send() -> None:  # 64 MiB of header, as fast as the gateway takes it
            nonlocal sent
            writer.write(HEAD + b"x-big: ")
            with contextlib.suppress(ConnectionError):
                while sent < 64 * 1024 * 1024:
                    writer.write(b"a" * 65536)
                    await writer.drain()
                    sent += 65536

        sending = asyncio.create_task(send())
        answer = await reader.read(4096)
        await sending  # the client ignores the answer and goes on until the gateway closes
        grown = _rss_mib() - before
        writer.close()
        async with httpx.AsyncClient() as c:
            after = await c.post(url + "/v1/chat/completions", json=CHAT)
    status, headers, body = _answer(answer)
    assert status == 431 and headers["connection"] == "close"
    assert body["error"] == {
        "message": "the request's headers are larger than the gateway's limit of 16384 bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_header_fields_too_large",
    }
    assert grown < 16, f"RSS grew {grown:.0f} MiB for {sent >> 20} MiB of header"
    assert after.status_code == 200


async def test_a_trickled_body_is_cut_with_a_408(tmp_path):
    async with _gateway(tmp_path, body_timeout_s=0.5) as (url, fake):
        reader, writer = await asyncio.open_connection(*_address(url))
        writer.write(HEAD + b"content-length: 1000\r\n\r\n")
        reading = asyncio.create_task(reader.read())
        while not reading.done():
            with contextlib.suppress(ConnectionError):
                writer.write(b" ")
            await asyncio.wait([reading], timeout=0.1)
        writer.close()
    status, _, body = _answer(reading.result())
    assert status == 408 and body["error"]["message"] == "the request's body did not arrive in time"
    assert fake.received == []


async def test_refusals_on_anthropics_route_are_in_its_shape(tmp_path):
    """A head too large in one write (the parser sees none of it) and a trickled body, on
    ``/v1/messages``: Anthropic's error shape, as every other error there."""
    head = b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: x\r\n"
    answers = []
    async with _gateway(tmp_path, max_header_bytes=4096, body_timeout_s=0.3) as (url, fake):
        for sent in (
            head + b"x-big: " + b"a" * 8192 + b"\r\n\r\n",
            head + b"content-length: 9\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection(*_address(url))
            writer.write(sent)
            answers.append(_answer(await asyncio.wait_for(reader.read(), 10)))
            writer.close()
    assert [status for status, _, _ in answers] == [431, 408]
    for _, _, body in answers:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert set(body["error"]) == {"type", "message"}
    assert fake.received == []


async def test_connections_above_the_cap_get_a_503_with_retry_after(tmp_path):
    async with _gateway(tmp_path, max_connections=8, max_connections_per_peer=8) as (url, _):
        held = [await asyncio.open_connection(*_address(url)) for _ in range(8)]
        async with httpx.AsyncClient() as c:
            refused = await c.post(url + "/v1/chat/completions", json=CHAT)
            for _, writer in held:
                writer.close()
            for _ in range(100):  # until the gateway has seen them go
                served = await c.post(url + "/v1/chat/completions", json=CHAT)
                if served.status_code == 200:
                    break
                await asyncio.sleep(0.05)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert served.status_code == 200


async def test_idle_connections_are_closed(tmp_path):
    async with _gateway(tmp_path, header_timeout_s=0.3, keepalive_timeout_s=0.3) as (url, _):
        silent, quiet = await asyncio.open_connection(*_address(url))
        kept, writer = await asyncio.open_connection(*_address(url))
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        first = await kept.readuntil(b'{"status":"ok"}')
        assert await asyncio.wait_for(silent.read(), 10) == b""  # never sent a byte: no answer
        assert await asyncio.wait_for(kept.read(), 10) == b""  # closed after its answer
        quiet.close()
        writer.close()
    assert first.startswith(b"HTTP/1.1 200")


async def test_pipelined_requests_and_large_bodies_pass(tmp_path):
    async with _gateway(tmp_path, max_header_bytes=1024) as (url, fake):
        reader, writer = await asyncio.open_connection(*_address(url))
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 40)  # 40 heads in one write
        answers = b""
        while answers.count(b"HTTP/1.1 200") < 40:
            answers += await reader.read(65536)
        writer.close()
        padded = {**CHAT, "padding": "p" * 1024 * 1024}  # head and body in the same reads
        async with httpx.AsyncClient() as c:
            big = await c.post(url + "/v1/chat/completions", json=padded)
    assert big.status_code == 200 and len(fake.received) == 1


async def test_bytes_that_are_not_http_get_an_openai_shaped_400(tmp_path):
    async with _gateway(tmp_path) as (url, _):
        reader, writer = await asyncio.open_connection(*_address(url))
        writer.write(b"\x16\x03\x01 not http\r\n\r\n")
        answer = await reader.read()
        writer.close()
    status, _, body = _answer(answer)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


async def test_one_address_holds_at_most_its_share_of_connections(tmp_path):
    async with _gateway(tmp_path, max_connections=8, max_connections_per_peer=3) as (url, _):
        held = [await asyncio.open_connection(*_address(url)) for _ in range(3)]
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with httpx.AsyncClient() as c, httpx.AsyncClient(transport=other) as d:
            refused = await c.post(url + "/v1/chat/completions", json=CHAT)
            served = await d.post(url + "/v1/chat/completions", json=CHAT)
            for _, writer in held:
                writer.close()
            for _ in range(100):  # until the gateway has seen them go
                again = await c.post(url + "/v1/chat/completions", json=CHAT)
                if again.status_code == 200:
                    break
                await asyncio.sleep(0.05)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "too_many_connections_from_peer"
    assert served.status_code == 200 and again.status_code == 200


async def test_a_connection_flood_from_one_address_starves_no_other(tmp_path):
    """One address opening connections as fast as it can and reading none of them (each
    sends a request): its refusals are closed at once, outside the count, so they never
    fill the cap, and a client from another address, on a new connection per request, is
    answered throughout. The flood is bounded: 2,000 connections (fewer under a low file
    limit: both ends are in this process) or 3 s, on loopback."""
    most = min(2000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 3)
    async with _gateway(tmp_path, max_connections=40) as (url, _):
        host, port = _address(url)
        request = HEAD + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        body = orjson.dumps(CHAT)
        held: list[asyncio.StreamWriter] = []
        end = asyncio.get_running_loop().time() + 3

        async def flood() -> None:
            while asyncio.get_running_loop().time() < end and len(held) < most:
                try:
                    _, writer = await asyncio.open_connection(host, port)
                except OSError:
                    await asyncio.sleep(0.01)
                    continue
                held.append(writer)
                writer.write(request % (len(body), body))  # never read

        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        fresh = httpx.Limits(max_keepalive_connections=0)  # a new connection per request
        statuses: list[int] = []
        async with httpx.AsyncClient(transport=other, limits=fresh, timeout=10) as c:
            flooding = [asyncio.create_task(flood()) for _ in range(8)]
            await asyncio.sleep(0.3)  # the flood is on, its share long taken
            while asyncio.get_running_loop().time() < end - 0.2:
                statuses.append((await c.post(url + "/v1/chat/completions", json=CHAT)).status_code)
                await asyncio.sleep(0.02)
            await asyncio.gather(*flooding)
        for writer in held:
            writer.close()
    assert len(held) > 3 * 40  # the flood was far over its share (20) and the cap (40)
    assert len(statuses) >= 5 and set(statuses) == {200}, statuses


def _chunked(trailer: bytes = b"", extension: bytes = b"") -> bytes:
    """A chat request with a chunked body, then ``trailer`` (whole lines, or a start)."""
    body = orjson.dumps(CHAT)
    head = HEAD + b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    chunks = b"%x%s\r\n%s\r\n" % (len(body), extension, body)
    return head + chunks + b"0\r\n" + trailer


async def test_a_chunked_trailer_counts_against_the_head_limit(tmp_path):
    async with _gateway(tmp_path, max_header_bytes=16 * 1024) as (url, fake):
        reader, writer = await asyncio.open_connection(*_address(url))
        before = _rss_mib()

        async def send() -> None:  # 64 MiB of trailer, as fast as the gateway takes it
            writer.write(_chunked(b"x-trailer: "))
            with contextlib.suppress(ConnectionError):
                for _ in range(1024):
                    writer.write(b"t" * 65536)
                    await writer.drain()

        sending = asyncio.create_task(send())
        answer = await asyncio.wait_for(reader.read(), 30)
        await sending
        grown = _rss_mib() - before
        writer.close()
        async with httpx.AsyncClient() as c:
            after = await c.post(url + "/v1/chat/completions", json=CHAT)
    status, headers, body = _answer(answer)
    assert status == 431 and headers["connection"] == "close"
    assert body["error"]["code"] == "request_header_fields_too_large"
    assert "trailer" in body["error"]["message"]
    assert grown < 16, f"RSS grew {grown:.0f} MiB"
    assert len(fake.received) == 1 and after.status_code == 200  # only the one after


async def test_a_long_chunk_extension_counts_against_the_head_limit(tmp_path):
    async with _gateway(tmp_path, max_header_bytes=16 * 1024) as (url, fake):
        reader, writer = await asyncio.open_connection(*_address(url))
        writer.write(_chunked(b"\r\n", b";x=" + b"e" * 20000))
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    assert _answer(answer)[0] == 431 and fake.received == []


async def test_chunked_bodies_with_small_trailers_and_tiny_chunks_pass(tmp_path):
    async with _gateway(tmp_path, max_header_bytes=1024) as (url, fake):
        reader, writer = await asyncio.open_connection(*_address(url))
        writer.write(_chunked(b"x-checksum: abc\r\nauthorization: Bearer sk-x\r\n\r\n"))
        first = _responses(await _read_answers(reader, 1))
        body = orjson.dumps({**CHAT, "padding": "p" * 6000})
        tiny = b"".join(b"1\r\n%s\r\n" % body[i : i + 1] for i in range(len(body)))
        head = HEAD + b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(head + tiny + b"0\r\n\r\n")  # 30 KB of framing in 1 KiB of head limit
        second = _responses(await _read_answers(reader, 1))
        writer.close()
    assert [s for s, _ in first + second] == [200, 200]
    # both bodies reached the pool whole (a mirror the gateway sends to learn may come beside)
    padded = [r for r in fake.received if r.get("padding") == "p" * 6000]
    assert padded and len(fake.received) - len(padded) >= 1


async def test_a_body_of_a_million_one_byte_chunks_is_read_whole_and_in_order(tmp_path):
    # framed and parsed in turns of the event loop: every byte reaches the request, the
    # request pipelined after it is answered after it, and other clients are served meanwhile
    async with _gateway(tmp_path) as (url, fake):
        body = orjson.dumps({**CHAT, "padding": "p" * 1_000_000})
        wire = bytearray(6 * len(body))  # b"1\r\n" + one byte + b"\r\n", a byte at a time
        for offset, fill in enumerate((b"1", b"\r", b"\n", body, b"\r", b"\n")):
            wire[offset::6] = fill * (len(body) // len(fill))
        head = HEAD + b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        reader, writer = await asyncio.open_connection(*_address(url))
        sending = asyncio.create_task(_send(writer, head, wire, b"0\r\n\r\n" + HEALTH))
        others = await _normal_clients(url, clients=2, requests=3, pause_s=0)
        answers = _responses(await _read_answers(reader, 2))
        await sending
        writer.close()
    assert [status for status, _ in answers] == [200, 200] and others == [200] * 6
    assert orjson.loads(answers[1][1])["status"] == "ok"  # the pipelined /healthz, second
    # whole wherever it went (a mirror the gateway sends to learn may come beside it)
    padded = [len(r["padding"]) for r in fake.received if "padding" in r]
    assert padded and set(padded) == {1_000_000}


HEALTH = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"


async def _send(writer: asyncio.StreamWriter, *parts: bytes | bytearray) -> None:
    for part in parts:
        for at in range(0, len(part), 65536):
            writer.write(part[at : at + 65536])
            await writer.drain()


async def test_a_pipelined_head_in_the_same_read_is_counted(tmp_path):
    async with _gateway(tmp_path, max_header_bytes=16 * 1024) as (url, fake):
        reader, writer = await asyncio.open_connection(*_address(url))
        body = orjson.dumps(CHAT)
        first = HEAD + b"content-length: %d\r\n\r\n%s" % (len(body), body)
        writer.write(first + HEAD + b"x-big: " + b"a" * 20000 + b"\r\n\r\n")
        answers = _responses(await asyncio.wait_for(reader.read(), 30))
        writer.close()
    assert [status for status, _ in answers] == [200, 431]
    assert len(fake.received) == 1


@pytest.mark.parametrize("second", ["oversized", "stalled", "not http"])
async def test_a_refused_pipelined_request_is_answered_after_the_one_before(tmp_path, second):
    expected = {"oversized": 431, "stalled": 408, "not http": 400}[second]
    async with _gateway(tmp_path, max_header_bytes=16 * 1024, header_timeout_s=0.3) as (url, fake):
        fake.behaviour.delay_s = 1.0
        reader, writer = await asyncio.open_connection(*_address(url))
        body = orjson.dumps(CHAT)
        writer.write(HEAD + b"content-length: %d\r\n\r\n%s" % (len(body), body))
        while not fake.received:  # the first request is with the upstream
            await asyncio.sleep(0.02)
        if second == "oversized":
            writer.write(HEAD + b"x-big: " + b"a" * 20000)
        elif second == "stalled":
            writer.write(HEAD)
        else:
            writer.write(b"\x16\x03\x01 not http\r\n\r\n")
        answers = _responses(await asyncio.wait_for(reader.read(), 30))
        writer.close()
    assert [status for status, _ in answers] == [200, expected]
    assert orjson.loads(answers[0][1])["choices"][0]["message"]["content"]


async def _read_answers(reader: asyncio.StreamReader, count: int) -> bytes:
    raw = b""
    while len(_responses(raw, complete=False)) < count:
        raw += await asyncio.wait_for(reader.read(65536), 10)
    return raw


def _responses(raw: bytes, complete: bool = True) -> list[tuple[int, bytes]]:
    """Each whole answer in ``raw`` (all with a content-length): its status and body."""
    found = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        if not sep or len(rest) < length:
            assert not complete, raw[:200]
            break
        found.append((int(lines[0].split()[1]), rest[:length]))
        raw = rest[length:]
    return found


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20
