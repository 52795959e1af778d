"""DNS discovery: a host name becomes one endpoint per address, each with its own breaker."""

from __future__ import annotations

import httpx
import pytest

from backends.discovery import resolve, with_host
from tests.fakes import FakeUpstream
from tests.gateways import gateway, settings
from tests.servers import serving

pytestmark = pytest.mark.anyio


def test_with_host_keeps_scheme_port_and_path_and_brackets_ipv6():
    assert with_host("http://svc:8000/x", "10.0.0.7") == "http://10.0.0.7:8000/x"
    assert with_host("http://svc:8000", "fd00::1") == "http://[fd00::1]:8000"


async def test_resolve_expands_localhost_and_tolerates_unknown_hosts():
    assert "http://127.0.0.1:9" in await resolve("http://localhost:9")
    assert await resolve("http://no-such-host.invalid:9") == []


async def test_pool_with_dns_discovery_serves_through_resolved_addresses(tmp_path):
    fake = FakeUpstream()
    async with serving(fake.app()) as spec, serving(fake.app()) as std:
        port = spec.rsplit(":", 1)[1]
        text = f"""
version: 1
pools:
  spec:
    kind: speculative
    model: tiny
    num_speculative_tokens: 4
    endpoints: ["http://localhost:{port}"]
    discovery: dns
  standard: {{kind: standard, model: tiny, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""
        async with gateway(settings(tmp_path, text)) as (url, services), httpx.AsyncClient() as c:
            for _ in range(4):
                r = await c.post(
                    url + "/v1/chat/completions",
                    json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.headers["x-speclane-pool"] == "spec"
            urls = {e.url for e in services.pools.endpoints["spec"]}
    assert f"http://127.0.0.1:{port}" in urls and f"http://localhost:{port}" not in urls
