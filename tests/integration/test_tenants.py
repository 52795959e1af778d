"""Tenants come from a source the operator trusts: a client cannot change its tenant, escape
a deny list (by sending no key either), claim an allow list, the kill switch's included, or
pick its rollout arm; nothing it sends changes flags, the policy or another tenant's traffic;
and each tenant's requests in flight are capped."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.identity import key_hash
from tests.fakes import Behaviour, FakeUpstream
from tests.gateways import fake_stack, served_by

pytestmark = pytest.mark.anyio

TOKEN = "adm1n"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
JSON_CHAT = {**CHAT, "response_format": {"type": "json_object"}}
POLICY = """
version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: tiny, endpoints: ["{std}"]}}
ladder: [spec, standard]
flags:
  spec-json: {{tenants: {{deny: [acme]}}}}
tenants:
  acme: {{api_keys: ["ACME"]}}
  beta: {{api_keys: ["BETA"], max_concurrent_requests: 2}}
rules:
  - {{name: json, match: {{response_format: [json_object]}}, start: spec, flag: spec-json}}
  - {{name: default, start: spec}}
""".replace("ACME", key_hash("sk-acme")).replace("BETA", key_hash("sk-beta"))


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer sk-{name}"}


async def test_a_client_cannot_change_its_tenant(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        denied = await served_by(c, url, JSON_CHAT, **key("acme"))
        claims = [
            await served_by(c, url, JSON_CHAT, **key("acme") | {"x-speclane-tenant": "beta"}),
            await served_by(c, url, {**JSON_CHAT, "user": "beta"}, **key("acme")),
            await served_by(c, url, {**JSON_CHAT, "user": "x", "tenant": "beta"}, **key("acme")),
        ]
        others = [
            await served_by(c, url, JSON_CHAT, **key("beta")),
            await served_by(c, url, JSON_CHAT),
        ]
        only_beta = {"tenants": {"allow": ["beta"]}, "reason": "beta only"}
        put = await c.put(url + "/admin/flags/speculation", json=only_beta, headers=AUTH)
        assert put.status_code == 200
        allowed = await served_by(c, url, CHAT, **key("beta"))
        pretenders = [
            await served_by(c, url, CHAT, **{"x-speclane-tenant": "beta"}),
            await served_by(c, url, CHAT, **key("unknown") | {"x-speclane-tenant": "beta"}),
            await served_by(c, url, {**CHAT, "user": "beta"}, **key("acme")),
        ]
    assert denied == "standard" and claims == ["standard"] * 3  # the deny list holds
    assert others == ["spec", "standard"]  # beta; no key is anonymous, denied as acme is
    assert allowed == "spec" and pretenders == ["standard"] * 3  # the kill switch holds


async def test_a_header_names_the_tenant_only_when_the_operator_trusts_it(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(
            tmp_path,
            fake.app(),
            fake.app(),
            POLICY,
            trusted_tenant_header="X-Auth-Tenant",
            admin_token=TOKEN,
        ) as (url, _),
        httpx.AsyncClient() as c,
    ):
        only_acme = {"tenants": {"allow": ["acme"]}, "reason": "acme only"}
        await c.put(url + "/admin/flags/speculation", json=only_acme, headers=AUTH)
        by_proxy = await served_by(c, url, CHAT, **{"x-auth-tenant": "acme"})
        by_client = await served_by(c, url, CHAT, **{"x-speclane-tenant": "acme"})
    assert by_proxy == "spec" and by_client == "standard"


FLAG_SETTINGS = {
    "deny list": ("spec-json", {"tenants": {"deny": ["acme"]}, "reason": "t"}),
    "kill switch deny list": ("speculation", {"tenants": {"deny": ["acme"]}, "reason": "t"}),
    "kill switch allow list": ("speculation", {"tenants": {"allow": ["beta"]}, "reason": "t"}),
    "rollout": ("spec-json", {"rollout": 50, "tenants": {"deny": []}, "reason": "t"}),
    "off": ("spec-json", {"enabled": False, "reason": "t"}),
}


@pytest.mark.parametrize("setting", FLAG_SETTINGS)
async def test_dropping_the_key_never_improves_what_a_client_gets(tmp_path, setting):
    fake = FakeUpstream()
    flag, value = FLAG_SETTINGS[setting]
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        put = await c.put(url + f"/admin/flags/{flag}", json=value, headers=AUTH)
        assert put.status_code == 200
        for body in (CHAT, JSON_CHAT):
            for tenant in ("acme", "beta"):
                keyed = await served_by(c, url, body, **key(tenant))
                keyless = [
                    await served_by(c, url, {**body, "user": user}, **headers)
                    for user in ("a", "b", tenant)
                    for headers in ({}, key("unknown"), {"x-speclane-tenant": tenant})
                ]
                if keyed == "standard":
                    assert set(keyless) == {"standard"}, (body, tenant, keyless)


CLAIMS: list[tuple[dict[str, str], dict[str, object]]] = [
    ({"x-speclane-tenant": "beta"}, {}),
    ({"x-speclane-pool": "spec", "x-speclane-rule": "default"}, {}),
    ({"x-speclane-flag": "spec-json=on", "x-forwarded-for": "10.0.0.1"}, {}),
    ({"x-tenant": "beta", "x-auth-tenant": "beta", "cookie": "tenant=beta"}, {}),
    ({"x-request-id": "beta"}, {"user": "beta"}),
    ({}, {"metadata": {"tenant": "beta", "flags": {"spec-json": True}}}),
    ({}, {"tenant": "beta", "flags": {"speculation": True}, "policy": "rules: []"}),
    ({}, {"speclane": {"tenant": "beta", "pool": "spec"}, "extra_body": {"tenant": "beta"}}),
]


async def test_nothing_a_client_sends_changes_its_tenant_flags_policy_or_others(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, svc),
        httpx.AsyncClient() as c,
    ):
        version = svc.policy.version
        flags = (await c.get(url + "/admin/flags", headers=AUTH)).json()
        served = [
            await served_by(c, url, {**JSON_CHAT, **body}, **headers | auth)
            for headers, body in CLAIMS
            for auth in (key("acme"), {})
        ]
        beta = await served_by(c, url, JSON_CHAT, **key("beta"))
        after = (await c.get(url + "/admin/flags", headers=AUTH)).json()
        audit = (await c.get(url + "/admin/audit", headers=AUTH)).json()["audit"]
    assert served == ["standard"] * len(served)  # acme's deny list holds, with a key or none
    assert beta == "spec"  # another tenant's traffic is as it was
    assert after == flags and audit == [] and svc.policy.version == version


async def test_keys_can_be_required(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, require_api_key=True) as (url, _),
        httpx.AsyncClient() as c,
    ):
        known = await c.post(url + "/v1/chat/completions", json=CHAT, headers=key("beta"))
        refused = [
            await c.post(url + "/v1/chat/completions", json=CHAT, headers=headers)
            for headers in ({}, key("guess"), {"x-speclane-tenant": "beta"})
        ]
    assert known.status_code == 200
    assert [r.status_code for r in refused] == [401] * 3
    assert all(r.json()["error"]["code"] == "invalid_api_key" for r in refused)
    assert fake.received == [CHAT | {"stream": True, "stream_options": {"include_usage": True}}]


async def test_requests_in_flight_are_capped_per_tenant_and_in_all(tmp_path):
    slow = FakeUpstream(Behaviour(chunk_delay_s=0.1))
    async with (
        fake_stack(tmp_path, slow.app(), slow.app(), POLICY, max_requests=4) as (url, services),
        httpx.AsyncClient(timeout=30) as c,
    ):
        body = {**CHAT, "stream": True}

        async def held(headers: dict[str, str]) -> httpx.Response:
            return await c.post(url + "/v1/chat/completions", json=body, headers=headers)

        beta = [asyncio.create_task(held(key("beta"))) for _ in range(2)]
        while services.gate.in_flight("beta") < 2:
            await asyncio.sleep(0.01)
        over_tenant = await held(key("beta"))
        acme = [asyncio.create_task(held(key("acme"))) for _ in range(2)]
        while services.gate.total < 4:
            await asyncio.sleep(0.01)
        over_all = await held(key("acme"))
        served = await asyncio.gather(*beta, *acme)
        after = await held(key("beta"))
    assert over_tenant.status_code == over_all.status_code == 429
    assert over_tenant.headers["retry-after"] == "1" and over_all.headers["retry-after"] == "1"
    assert "tenant beta's limit" in over_tenant.json()["error"]["message"]
    assert over_all.json()["error"]["code"] == "too_many_requests"
    assert [r.status_code for r in served] == [200] * 4 and after.status_code == 200
    assert services.gate.total == 0


async def test_claims_of_another_tenant_never_take_its_share(tmp_path):
    slow = FakeUpstream(Behaviour(chunk_delay_s=0.1))
    async with (
        fake_stack(tmp_path, slow.app(), slow.app(), POLICY) as (url, services),
        httpx.AsyncClient(timeout=30) as c,
    ):

        async def held(headers: dict[str, str], body: dict[str, object]) -> int:
            sent = {**CHAT, **body, "stream": True}
            response = await c.post(url + "/v1/chat/completions", json=sent, headers=headers)
            return response.status_code

        claims = [
            asyncio.create_task(held(headers | auth, body))
            for headers, body in CLAIMS
            for auth in (key("acme"), {})
        ]
        while services.gate.total < len(claims):
            await asyncio.sleep(0.01)
        charged = services.gate.in_flight("beta")
        beta = await asyncio.gather(held(key("beta"), {}), held(key("beta"), {}))
        statuses = await asyncio.gather(*claims)
    assert charged == 0  # beta's cap of 2 is beta's own
    assert beta == [200, 200] and statuses == [200] * len(claims)
