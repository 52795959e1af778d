"""/metrics says what the flags are, from the start and after every change, so an operator
can alert on "speculation disabled"; and a policy reload takes the series of the rules it
removed with them, the guardrail's gauges and the counters alike."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import FakeUpstream
from tests.gateways import fake_stack

pytestmark = pytest.mark.anyio

ADMIN = {"authorization": "Bearer t"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
CREATIVE = """  - name: creative
    match: {{temperature: {{min: 0.9}}}}
    start: spec
"""
POLICY = f"""
version: 1
pools:
  spec: {{{{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: ["{{spec}}"]}}}}
  standard: {{{{kind: standard, model: tiny, endpoints: ["{{std}}"]}}}}
ladder: [spec, standard]
rules:
{CREATIVE}  - name: default
    start: spec
"""
CREATIVE = CREATIVE.format()  # as the file has it


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def state(text: str, flag: str) -> tuple[str, str]:
    """The one state a flag is in, and where its value comes from."""
    (on,) = [
        (dict(labels)["state"], dict(labels)["source"])
        for labels, value in samples(text, "speclane_flag_state").items()
        if dict(labels)["flag"] == flag and value == 1
    ]
    return on


async def test_the_kill_switch_and_rollouts_are_series(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(
            tmp_path, fake.app(), fake.app(), admin_token="t", trusted_tenant_header="x-tenant"
        ) as (url, _),
        httpx.AsyncClient() as c,
    ):

        async def scrape() -> str:
            return (await c.get(url + "/metrics")).text

        async def put(body: dict[str, object]) -> None:
            answer = await c.put(url + "/admin/flags/speculation", json=body, headers=ADMIN)
            assert answer.status_code == 200, answer.text

        started = await scrape()
        await put({"enabled": False, "reason": "incident"})
        off = await scrape()
        await put({"enabled": True, "rollout": 50, "reason": "half"})
        half = await scrape()
        gone = await c.delete(
            url + "/admin/flags/speculation", params={"reason": "over"}, headers=ADMIN
        )
        assert gone.is_success
        back = await scrape()
    assert state(started, "speculation") == ("on", "implicit")
    assert state(off, "speculation") == ("off", "ops")
    assert state(half, "speculation") == ("limited", "ops")
    assert state(back, "speculation") == ("on", "implicit")
    rollout = (("flag", "speculation"),)
    assert samples(half, "speclane_flag_rollout_percent")[rollout] == 50
    assert samples(started, "speclane_flag_rollout_percent")[rollout] == 100
    # what an alert on "speculation disabled" reads: present, and 0, while it is not
    off_series = (("flag", "speculation"), ("source", "implicit"), ("state", "off"))
    assert samples(started, "speclane_flag_state")[off_series] == 0


async def test_a_reload_prunes_the_series_of_a_removed_rule(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token="t") as (url, services),
        httpx.AsyncClient() as c,
    ):
        for temperature in (1.0, 0.0):
            body = CHAT | {"temperature": temperature}
            assert (await c.post(url + "/v1/chat/completions", json=body)).status_code == 200
        before = (await c.get(url + "/metrics")).text
        path = services.policy.path
        path.write_text(path.read_text().replace(CREATIVE, ""))
        assert (await c.post(url + "/admin/policy/reload", headers=ADMIN)).status_code == 200
        after = (await c.get(url + "/metrics")).text
    for name in ("speclane_guardrail_phase", "speclane_requests_total"):
        assert rules(before, name) == {"creative", "default"}
        assert rules(after, name) == {"default"}
    assert 'rule="creative"' not in after  # no series of it left, gauge or counter


def rules(text: str, name: str) -> set[str]:
    return {dict(labels)["rule"] for labels in samples(text, name)}
