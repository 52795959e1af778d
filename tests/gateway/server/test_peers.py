"""Whose a connection is, for the per-peer share of connections."""

from __future__ import annotations

import pytest

from gateway.server.connections import peer_of


@pytest.mark.parametrize(
    ("host", "peer"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("not an address", "not an address"),
    ],
)
def test_an_ipv6_client_is_its_64(host, peer):
    assert peer_of(host) == peer
