"""SSE decoding: whole files, arbitrary splits, CRLF, multi-line data, comments."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backends.sse import SSEDecoder
from tests.fakes import FIXTURES, events

RAW = (FIXTURES / "chat-stream-include-usage.sse").read_bytes()


def decode(parts: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    out = []
    for part in parts:
        out += decoder.feed(part)
    return out


def test_whole_fixture():
    assert decode([RAW]) == events("chat-stream-include-usage.sse")


@given(st.lists(st.integers(min_value=0, max_value=len(RAW)), max_size=30))
def test_any_split_gives_the_same_events(cuts):
    points = sorted(set(cuts))
    parts = [RAW[a:b] for a, b in zip([0, *points], [*points, len(RAW)], strict=True)]
    assert decode(parts) == events("chat-stream-include-usage.sse")


def test_crlf_multiline_comments_and_other_fields():
    stream = (
        b": keep-alive\r\n\r\nevent: x\r\nid: 7\r\ndata: a\r\ndata:b\r\n\r\n"
        b"database: no\n\ndata\n\n"
    )
    assert decode([stream[:9], stream[9:30], stream[30:]]) == [b"a\nb", b""]


def test_incomplete_event_waits_for_its_blank_line():
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a": 1}\n') == []
    assert decoder.pending == b'data: {"a": 1}\n'
    assert decoder.feed(b"\n") == [b'{"a": 1}']


def test_a_large_event_in_many_chunks_is_kept_as_chunks_and_counted():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: ") == []
    for _ in range(1000):
        assert decoder.feed(b"x" * 1000) == []
    assert decoder.buffered == 6 + 1000 * 1000
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\ndata: y\n\n") == [b"x" * 1_000_000, b"y"]
    assert decoder.buffered == 0
