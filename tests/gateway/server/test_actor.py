"""Who the audit log names for an admin change: what the ``x-speclane-actor`` header says,
printable, never a forged line of its own."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from gateway.server.admin_policy import actor


def _request(*headers: tuple[bytes, bytes]) -> Request:
    return Request({"type": "http", "method": "PUT", "path": "/admin/flags/x", "headers": headers})


@pytest.mark.parametrize(
    ("sent", "named"),
    [
        (None, "admin"),
        (b"alice", "alice"),
        (b"ops\x1b[31m\x07 bob\tx", "ops[31m bobx"),
        (b"\x1b\x00\x7f", "admin"),
        (b"a" * 500, "a" * 100),
    ],
)
def test_the_actor_is_what_the_header_says_printable(sent, named):
    headers = () if sent is None else ((b"x-speclane-actor", sent),)
    assert actor(_request(*headers)) == named
