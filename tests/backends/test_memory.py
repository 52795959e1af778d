"""Memory given back after large answers: ``malloc_trim`` a moment after one is done with,
through the upstream HTTP client on a real socket."""

from __future__ import annotations

import asyncio
import platform

import pytest

from backends.http1 import Client
from backends.memory import Trimmer, libc_trim
from tests.backends.test_http1 import read_request, server

pytestmark = pytest.mark.anyio


class Trims:
    """Stands in for ``malloc_trim``: counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, pad: int) -> int:
        assert pad == 0
        self.calls += 1
        return 1


async def test_a_large_answer_is_followed_by_one_trim_and_small_ones_by_none() -> None:
    trims = Trims()
    trimmer = Trimmer(asyncio.get_running_loop(), trims, large=1000, delay_s=0.01)
    trimmer.freed(999)
    await asyncio.sleep(0.05)
    assert trims.calls == 0
    for _ in range(5):  # a burst of large answers: one trim after it
        trimmer.freed(5000)
    await asyncio.sleep(0.05)
    assert trims.calls == 1
    trimmer.freed(5000)
    trimmer.close()  # a closing client cancels what is pending
    await asyncio.sleep(0.05)
    assert trims.calls == 1


@pytest.mark.parametrize("abandoned", [False, True])
async def test_the_client_tells_of_every_answer_it_is_done_with(abandoned: bool) -> None:
    body = b"x" * (3 << 20)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    trims = Trims()
    trimmer = Trimmer(asyncio.get_running_loop(), trims, large=2 << 20, delay_s=0.01)
    async with server(handle) as srv:
        c = Client(trimmer=trimmer)
        response = await c.request(b"POST", srv.url + "/x", {}, b"", connect_s=2, idle_s=5)
        got = 0
        while (chunk := await response.chunk()) and not (abandoned and got > 2 << 20):
            got += len(chunk)
        if abandoned:  # given up part way, as an answer over max_response_bytes is
            response.close()
        else:
            response.release()
        await asyncio.sleep(0.05)
        await c.close()
    assert trims.calls == 1


def test_glibc_has_malloc_trim() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    trim = libc_trim()
    assert trim is not None
    trim(0)
