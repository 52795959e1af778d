"""Where a request ends in a connection's bytes, however the reads split them."""

from __future__ import annotations

import pytest

from gateway.server.framing import Chunked, HeadEnd, Sized, body_of

NEXT = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


def _split(body: Chunked | Sized, raw: bytes, step: int) -> tuple[int, bool]:
    """Give ``raw`` to ``body`` ``step`` bytes a read: where it said the body ended."""
    at = 0
    while at < len(raw):
        taken, ended = body.take(raw[at : at + step])
        at += taken
        if ended:
            return at, True
    return at, False


@pytest.mark.parametrize("step", [1, 2, 3, 5, 64, 10_000])
def test_a_chunked_body_ends_after_its_trailer_in_any_split(step):
    body = b"5;name=value\r\nhello\r\n10\r\n" + b"x" * 16 + b"\r\n0\r\nx-t: v\r\nx-u: w\r\n\r\n"
    chunked = Chunked()
    assert _split(chunked, body + NEXT, step) == (len(body), True)
    assert chunked.extra == len(b"x-t: v\r\nx-u: w\r\n\r\n")


@pytest.mark.parametrize("step", [1, 4, 10_000])
def test_an_empty_trailer_and_long_extensions(step):
    chunked = Chunked()
    body = b"1;" + b"e" * 100 + b"\r\nx\r\n0\r\n\r\n"
    assert _split(chunked, body + NEXT, step) == (len(body), True)
    assert chunked.extra == len(b"1;" + b"e" * 100 + b"\r\n") - 18 + 2


def test_tiny_chunks_cost_nothing_against_the_limit():
    chunked = Chunked()
    body = b"1\r\nx\r\n" * 10_000 + b"0\r\n\r\n"
    assert _split(chunked, body, 4096) == (len(body), True) and chunked.extra == 2


@pytest.mark.parametrize("step", [1, 2, 7, 64, 10_000])
def test_chunks_of_every_small_size_end_where_they_end(step):
    # data that holds line ends and what looks like size lines, upper- and lower-case sizes
    sizes = [*range(1, 40), 15, 1, 1, 16, 255]
    body = b"".join(
        (f"{n:X}" if n % 2 else f"{n:x}").encode() + b"\r\n" + (b"\r\n0\r\n" * n)[:n] + b"\r\n"
        for n in sizes
    )
    body += b"0\r\n\r\n"
    chunked = Chunked()
    assert _split(chunked, body + NEXT, step) == (len(body), True)
    assert chunked.extra == 2


def test_a_trailer_that_never_ends_is_all_extra():
    chunked = Chunked()
    assert chunked.take(b"0\r\nx-t: " + b"t" * 1000) == (1008, False)
    assert chunked.extra == 1005


@pytest.mark.parametrize("step", [1, 3, 100])
def test_a_head_ends_at_its_blank_line(step):
    raw = b"POST / HTTP/1.1\r\nhost: x\r\n\r\nbody"
    head, at = HeadEnd(), 0
    while (end := head.end(raw[at : at + step])) is None:
        at += step
    assert at + end == raw.index(b"body")


def test_the_framing_comes_from_the_headers():
    assert isinstance(body_of([(b"transfer-encoding", b"chunked")]), Chunked)
    assert body_of([(b"content-length", b"0")]) is None and body_of([]) is None
    sized = body_of([(b"content-length", b"4")])
    assert sized is not None and sized.take(b"bodyGET") == (4, True)
