"""The upstream HTTP/1.1 client against real sockets on loopback: servers written byte by
byte, so each test says exactly what the upstream sends and when."""

from __future__ import annotations

import asyncio
import gc
import shutil
import ssl
import subprocess
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from backends.http1 import BadResponse, Client, ConnectError, Disconnected, _Connection, split

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LOOPS = ["asyncio", ("asyncio", {"use_uvloop": True})]  # the tests' loop, the gateway's loop
OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


@asynccontextmanager
async def server(handle: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    record = Server(handle)
    srv = await asyncio.start_server(record.serve, "127.0.0.1", 0, ssl=tls)
    port = srv.sockets[0].getsockname()[1]
    record.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        yield record
    finally:
        srv.close()
        for writer in record.writers:
            writer.close()
        await srv.wait_closed()


class Server:
    """Counts connections and keeps what each request looked like."""

    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            await self.handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


def client(**kw: object) -> Client:
    return Client(**kw)  # type: ignore[arg-type]


async def post(c: Client, url: str, body: bytes = b"{}", idle_s: float = 5.0) -> bytes:
    response = await c.request(
        b"POST",
        url + "/v1/chat/completions",
        {"x-request-id": "r1"},
        body,
        connect_s=2,
        idle_s=idle_s,
    )
    data = await response.read()
    response.release()
    return data


async def test_one_connection_carries_requests_in_turn() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(OK)

    async with server(handle) as srv:
        c = client()
        assert await post(c, srv.url, b'{"a":1}') == b'{"ok":true}'
        assert await post(c, srv.url, b'{"a":2}') == b'{"ok":true}'
        await c.close()
    assert srv.connections == 1
    head, body = seen[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"host: {srv.url.removeprefix('http://')}".encode() in head
    assert b"x-request-id: r1\r\n" in head and b"content-length: 7\r\n" in head
    assert [b for _, b in seen] == [b'{"a":1}', b'{"a":2}']


async def test_a_chunked_answer_arrives_as_it_is_sent() -> None:
    second = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        await second.wait()
        writer.write(b"4\r\nmore\r\n0\r\n\r\n")

    async with server(handle) as srv:
        c = client()
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        assert response.status == 200
        assert await response.chunk() == b"data: "  # before the server sent the rest
        second.set()
        assert await response.chunk() == b"more"
        assert await response.chunk() == b""
        response.release()
        await c.close()


async def test_a_body_that_ends_with_the_connection() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async with server(handle) as srv:
        c = client()
        assert await post(c, srv.url) == b"all of it"
        assert await post(c, srv.url) == b"all of it"
        await c.close()
    assert srv.connections == 2  # never reused


async def test_a_connection_lost_mid_body_is_an_error_after_what_came() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    async with server(handle) as srv:
        c = client()
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        assert await response.chunk() == b"partial"
        with pytest.raises(Disconnected):
            await response.chunk()
        response.close()
        await c.close()


async def test_an_upstream_that_goes_quiet_times_out() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(10)

    async with server(handle) as srv:
        c = client()
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=0.1)
        with pytest.raises(TimeoutError):
            await response.chunk()
        response.close()
        await c.close()


async def test_no_answer_at_all_times_out_waiting_for_the_head() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(10)

    async with server(handle) as srv:
        c = client()
        with pytest.raises(TimeoutError):
            await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=0.1)
        await c.close()


async def test_garbage_is_a_bad_response() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")

    async with server(handle) as srv:
        c = client()
        with pytest.raises(BadResponse):
            await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        await c.close()


async def test_nobody_listening_is_a_connect_error() -> None:
    async with server(read_request) as srv:  # type: ignore[arg-type]
        url = srv.url
    c = client()
    with pytest.raises(ConnectError):
        await c.request(b"POST", url + "/x", {}, b"", connect_s=2, idle_s=5)
    await c.close()


async def test_an_idle_connection_the_upstream_dropped_is_replaced_once() -> None:
    """The keep-alive race: the upstream closes an idle connection just as a request goes
    out on it. A fresh connection that closes without an answer is an error."""
    answered = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        await read_request(reader)
        if answered == 1:
            answered += 1
            return  # drop the request: as if the connection had idled out
        answered += 1
        writer.write(OK)
        await read_request(reader)  # the second request on this connection: dropped

    async with server(handle) as srv:
        c = client()
        assert await post(c, srv.url) == b'{"ok":true}'
        with pytest.raises(Disconnected):
            await post(c, srv.url)  # reused (dropped), then fresh (dropped): an error
        assert srv.connections == 2
        assert await post(c, srv.url) == b'{"ok":true}'
        await c.close()


async def test_at_most_max_connections_are_open() -> None:
    release = asyncio.Event()
    open_now = peak = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        try:
            while True:
                await read_request(reader)
                await release.wait()
                writer.write(OK)
                await writer.drain()
        finally:
            open_now -= 1

    async with server(handle) as srv:
        c = client(max_connections=1)
        both = asyncio.gather(post(c, srv.url), post(c, srv.url))
        await asyncio.sleep(0.05)
        release.set()
        assert await both == [b'{"ok":true}'] * 2
        await c.close()
    assert peak == 1 and srv.connections == 1


async def test_released_before_its_end_the_connection_is_reused_once_it_ends() -> None:
    rest = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nlast\r\n")
        await rest.wait()
        writer.write(b"0\r\n\r\n")
        await read_request(reader)
        writer.write(OK)

    async with server(handle) as srv:
        c = client()
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        assert await response.chunk() == b"last"
        response.release()  # the caller has all it wants; the terminator is still to come
        rest.set()
        await asyncio.sleep(0.05)
        assert await post(c, srv.url) == b'{"ok":true}'
        await c.close()
    assert srv.connections == 1


async def test_an_abandoned_answer_closes_its_connection() -> None:
    gone = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        assert await reader.read() == b""  # the client hung up
        gone.set()

    async with server(handle) as srv:
        c = client()
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        assert await response.chunk() == b"a"
        response.close()
        await asyncio.wait_for(gone.wait(), 2)
        await c.close()


async def test_a_large_body_is_read_whole() -> None:
    body = bytes(range(256)) * 16_384  # 4 MiB, more than the read buffer holds

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async with server(handle) as srv:
        c = client()
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        got = b""
        while chunk := await response.chunk():
            got += chunk
            await asyncio.sleep(0)
        assert got == body
        response.release()
        await c.close()


async def test_a_line_break_in_a_header_is_refused() -> None:
    c = client()
    with pytest.raises(ValueError, match="line break"):
        await c.request(
            b"POST", "http://127.0.0.1:9/x", {"x-request-id": "a\r\nx: y"}, connect_s=1, idle_s=1
        )


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_https(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)

    async with server(handle, served) as srv:
        c = client(tls=ssl.create_default_context(cafile=str(cert)))
        assert await post(c, srv.url) == b'{"ok":true}'
        assert await post(c, srv.url) == b'{"ok":true}'
        await c.close()
        with pytest.raises(ConnectError):  # the system's CAs do not know this certificate
            await post(client(), srv.url)
    assert srv.connections == 1  # the handshake that failed never reached the handler


def test_split() -> None:
    origin, target = split("http://vllm-0:8000/v1/completions?x=1")
    assert (origin.host, origin.port, origin.host_header, target) == (
        "vllm-0",
        8000,
        b"vllm-0:8000",
        b"/v1/completions?x=1",
    )
    assert split("https://pool.example/v1")[0].host_header == b"pool.example"
    assert split("https://pool.example/v1")[0].port == 443
    assert split("http://[::1]:8000/")[0].host_header == b"[::1]:8000"
    with pytest.raises(ValueError):
        split("ftp://x/")


async def test_at_the_limit_an_idle_connection_elsewhere_makes_room() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)

    async with server(handle) as one, server(handle) as two:
        c = client(max_connections=1)
        assert await post(c, one.url) == b'{"ok":true}'  # stays open, idle
        assert await asyncio.wait_for(post(c, two.url), 2) == b'{"ok":true}'
        assert await asyncio.wait_for(post(c, one.url), 2) == b'{"ok":true}'
        await c.close()
    assert (one.connections, two.connections) == (2, 1)


async def test_a_body_still_coming_at_the_deadline_times_out() -> None:
    """Bytes that keep coming do not stretch the deadline: the read after it raises."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    async with server(handle) as srv:
        c = client()
        deadline = asyncio.get_running_loop().time() + 0.3
        response = await c.request(
            b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5, deadline=deadline
        )
        received = b""
        with pytest.raises(TimeoutError):
            while True:
                received += await response.chunk()
        assert received.startswith(b"x")
        response.close()
        await c.close()


async def test_retry_after_and_content_length_are_read() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 429 Too Many\r\nretry-after: 7\r\ncontent-length: 2\r\n\r\n{}")

    async with server(handle) as srv:
        c = client()
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        assert (response.status, response.retry_after, response.length) == (429, b"7", 2)
        assert await response.read() == b"{}"
        response.release()
        await c.close()


@contextmanager
def no_cycle_collector() -> Iterator[None]:
    """Only reference counts free objects meanwhile: what survives is kept alive or is in a
    reference cycle, which the gateway's rare collections (``gc.set_threshold``) leave for
    minutes."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def settle(ticks: int = 5) -> None:
    for _ in range(ticks):
        await asyncio.sleep(0)


@pytest.mark.parametrize("anyio_backend", LOOPS)
async def test_a_closed_connection_is_freed_by_its_last_reference() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"))
        await writer.drain()

    async with server(handle) as srv:
        c = client()
        with no_cycle_collector():
            response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
            conn = weakref.ref(response._conn)
            assert await response.read() == b'{"ok":true}'
            response.release()
            del response
            await settle()
            assert conn() is None
        await c.close()


@pytest.mark.parametrize("anyio_backend", LOOPS)
async def test_a_connection_lost_mid_body_is_freed_by_its_last_reference() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    async with server(handle) as srv:
        c = client()
        with no_cycle_collector():
            response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
            conn = weakref.ref(response._conn)
            assert await response.chunk() == b"partial"
            for _ in range(2):  # each read after the loss raises it
                with pytest.raises(Disconnected):
                    await response.chunk()
            response.close()
            del response
            await settle()
            assert conn() is None
        await c.close()


@pytest.mark.parametrize("anyio_backend", LOOPS)
async def test_many_dropped_connections_leave_nothing_behind() -> None:
    """The upstream answers and closes, as a keep-alive timeout does: every connection is
    gone once its answer is, however many there were."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()

    async with server(handle) as srv:
        c = client()
        with no_cycle_collector():
            for _ in range(50):
                assert await post(c, srv.url) == b'{"ok":true}'
                await settle()
            await c.close()
            alive = [o for o in gc.get_objects() if isinstance(o, _Connection)]
            assert alive == []
