"""The admin API: tokens, flags and the kill switch, audit, policy reload; and the flags CLI."""

from __future__ import annotations

import asyncio
import re
import sys

import httpx
import pytest

from gateway.cli.main import main
from gateway.identity import key_hash
from tests.fakes import FakeUpstream
from tests.gateways import fake_stack, served_by

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}

POLICY = """
version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: tiny, endpoints: ["{std}"]}}
ladder: [spec, standard]
guardrail: {{mode: threshold}}  # these tests are about flags: no exploration
flags:
  spec-json: {{enabled: true, description: structured output on speculation}}
rules:
  - name: json
    match: {{response_format: [json_object]}}
    start: spec
    flag: spec-json
  - {{name: default, start: spec}}
tenants:
  acme: {{api_keys: [KEY_ACME]}}
""".replace("KEY_ACME", key_hash("sk-acme"))


async def test_admin_refuses_missing_and_wrong_tokens(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        missing = await c.get(url + "/admin/flags")
        wrong = await c.get(url + "/admin/flags", headers={"authorization": "Bearer nope"})
        put = await c.put(url + "/admin/flags/speculation", json={"enabled": False})
        ok = await c.get(url + "/admin/flags", headers=AUTH)
    assert (missing.status_code, wrong.status_code, put.status_code) == (401, 403, 401)
    assert ok.status_code == 200
    names = {f["name"] for f in ok.json()["flags"]}
    assert names == {"speculation", "spec-json"}


async def test_the_admin_api_s_errors_are_not_counted_as_the_api_s(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        unknown_flag = await c.get(url + "/admin/flags/no-such-flag", headers=AUTH)
        wrong = await c.get(url + "/admin/flags", headers={"authorization": "Bearer nope"})
        unknown_model = await c.post(url + "/v1/chat/completions", json={**CHAT, "model": "x"})
        metrics = (await c.get(url + "/metrics")).text
    statuses = (unknown_flag.status_code, wrong.status_code, unknown_model.status_code)
    assert statuses == (404, 403, 404)
    counted = [x for x in metrics.splitlines() if x.startswith("speclane_request_errors_total")]
    assert counted == ['speclane_request_errors_total{code="model_not_found",status="404"} 1.0']


async def test_admin_is_disabled_without_a_token(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY) as (url, _),
        httpx.AsyncClient() as c,
    ):
        response = await c.get(url + "/admin/flags", headers=AUTH)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "admin_disabled"


async def test_kill_switch_sends_everything_to_standard_and_is_audited(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        assert await served_by(c, url, CHAT) == "spec"
        off = await c.put(
            url + "/admin/flags/speculation",
            json={"enabled": False, "reason": "incident 42"},
            headers={**AUTH, "x-speclane-actor": "alice"},
        )
        assert off.status_code == 200
        assert await served_by(c, url, CHAT) == "standard"
        reset = await c.delete(
            url + "/admin/flags/speculation", params={"reason": "over"}, headers=AUTH
        )
        assert reset.status_code == 200
        assert await served_by(c, url, CHAT) == "spec"
        audit = (await c.get(url + "/admin/audit", headers=AUTH)).json()["audit"]
    assert [(a["flag"], a["who"]) for a in audit] == [
        ("speculation", "alice"),
        ("speculation", "admin"),
    ]
    assert audit[0]["old"] is None and audit[0]["new"]["enabled"] is False
    assert audit[0]["reason"] == "incident 42"
    assert audit[1]["new"] is None


async def test_rule_flag_rollout_and_tenants(tmp_path):
    fake = FakeUpstream()
    json_chat = {**CHAT, "response_format": {"type": "json_object"}}
    tenants = "".join(f"  t{i}: {{{{api_keys: [{key_hash(f'sk-t{i}')}]}}}}\n" for i in range(40))
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY + tenants, admin_token=TOKEN) as (
            url,
            _,
        ),
        httpx.AsyncClient() as c,
    ):
        await c.put(
            url + "/admin/flags/spec-json", json={"enabled": False, "reason": "test"}, headers=AUTH
        )
        assert await served_by(c, url, json_chat) == "standard"
        assert await served_by(c, url, CHAT) == "spec"  # other rules keep speculating
        await c.put(
            url + "/admin/flags/spec-json",
            json={"enabled": True, "tenants": {"deny": ["acme"]}, "reason": "test"},
            headers=AUTH,
        )
        assert await served_by(c, url, json_chat, authorization="Bearer sk-acme") == "standard"
        assert await served_by(c, url, json_chat, authorization="Bearer sk-t1") == "spec"
        # no key, or one the policy does not know, escapes no deny list
        assert await served_by(c, url, json_chat, authorization="Bearer sk-other") == "standard"
        assert await served_by(c, url, json_chat) == "standard"
        await c.put(
            url + "/admin/flags/spec-json",
            json={"rollout": 50, "tenants": {"deny": []}, "reason": "test"},
            headers=AUTH,
        )
        pools = {
            i: {
                await served_by(
                    c, url, {**json_chat, "user": user}, authorization=f"Bearer sk-t{i}"
                )
                for user in ["a", "b", "c", "t0", "t1"]
            }
            for i in range(40)
        }
        anonymous = {await served_by(c, url, {**json_chat, "user": str(u)}) for u in range(10)}
    assert all(len(arm) == 1 for arm in pools.values())  # a tenant stays in one arm, any user
    assert 8 <= sum(arm == {"spec"} for arm in pools.values()) <= 32
    assert anonymous == {"standard"}  # outside every partial rollout


async def test_bad_flag_updates_are_400(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        bad_rollout = await c.put(url + "/admin/flags/x", json={"rollout": 150}, headers=AUTH)
        unknown = await c.put(url + "/admin/flags/x", json={"colour": "red"}, headers=AUTH)
        bad_name = await c.put(url + "/admin/flags/a%20b", json={}, headers=AUTH)
        created = {"create": True, "reason": "a name with a line break"}
        broken = await c.put(url + "/admin/flags/x%0A", json=created, headers=AUTH)
        not_json = await c.put(url + "/admin/flags/x", content=b"{", headers=AUTH)
        not_object = await c.post(url + "/admin/policy/lint", json=[1], headers=AUTH)
        listed = await c.get(url + "/admin/flags", headers=AUTH)
    assert bad_rollout.status_code == unknown.status_code == bad_name.status_code == 400
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "name"
    assert {f["name"] for f in listed.json()["flags"]} == {"speculation", "spec-json"}
    assert bad_rollout.json()["error"]["param"] == "rollout"
    # an error of the whole body names no field: no "None: " before what is wrong
    for whole in (not_json, not_object):
        error = whole.json()["error"]
        assert whole.status_code == 400 and error["param"] is None
        assert error["message"].startswith(("Invalid JSON", "Input should be")), error


async def test_limits_of_the_audit_and_the_guardrail_are_checked(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        for i in range(3):
            body = {"rollout": 10 * i, "reason": f"change {i}"}
            assert (await c.put(url + "/admin/flags/spec-json", json=body, headers=AUTH)).is_success

        async def audit(limit: str) -> httpx.Response:
            return await c.get(url + "/admin/audit", params={"limit": limit}, headers=AUTH)

        bad = [await audit(v) for v in ("abc", "0", "-1", "1.5", "", "²")]
        bad.append(await c.get(url + "/admin/guardrail?limit=abc", headers=AUTH))
        one = (await audit("1")).json()["audit"]
        huge = (await audit("9" * 5000)).json()["audit"]
        events = await c.get(url + "/admin/guardrail?limit=99999999999", headers=AUTH)
    assert [r.status_code for r in bad] == [400] * 7
    assert all(r.json()["error"]["param"] == "limit" for r in bad)
    assert [e["reason"] for e in one] == ["change 2"]
    assert [e["reason"] for e in huge] == ["change 0", "change 1", "change 2"]
    assert events.status_code == 200


async def test_reload_keeps_the_running_policy_when_the_new_one_is_bad(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, svc),
        httpx.AsyncClient() as c,
    ):
        path = svc.policy.path
        good = path.read_text()
        path.write_text(good.replace("start: spec\n    flag", "start: spek\n    flag"))
        rejected = await c.post(url + "/admin/policy/reload", headers=AUTH)
        assert rejected.status_code == 422
        errors = rejected.json()["errors"]
        assert any(":13:12: error: rules.0.start" in e and "spek" in e for e in errors), errors
        assert await served_by(c, url, CHAT) == "spec"
        path.write_text(
            good.replace("{name: default, start: spec}", "{name: default, start: standard}")
        )
        accepted = await c.post(url + "/admin/policy/reload", headers=AUTH)
        assert accepted.status_code == 200
        assert await served_by(c, url, CHAT) == "standard"


async def test_flags_cli_sets_and_lists(tmp_path, capsys):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _):
        common = ["flags", "--gateway", url, "--token", TOKEN]
        code = await asyncio.to_thread(
            main, [*common, "set", "speculation", "--off", "--reason", "x"]
        )
        assert code == 0
        assert await asyncio.to_thread(main, [*common, "list"]) == 0
        wrong = await asyncio.to_thread(main, ["flags", "--gateway", url, "--token", "no", "list"])
    out = capsys.readouterr()
    assert "speculation" in out.out and "off" in out.out
    assert wrong == 1 and "wrong token" in out.err


async def test_flags_cli_takes_options_after_the_sub_command(tmp_path, capsys):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _):
        late = ["list", "--gateway", url, "--token", TOKEN]
        assert await asyncio.to_thread(main, ["flags", *late]) == 0
        mixed = ["flags", "--gateway", url, "get", "spec-json", "--token", TOKEN, "--json"]
        assert await asyncio.to_thread(main, mixed) == 0
    out = capsys.readouterr().out
    assert "speculation\ton\t" in out  # piped: one tab-separated line per flag, never cut
    assert '"name": "spec-json"' in out


async def test_piped_flags_have_a_header_and_the_table_s_columns(tmp_path, capsys, monkeypatch):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _):
        common = ["flags", "--gateway", url, "--token", TOKEN]
        await asyncio.to_thread(
            main,
            [*common, "set", "spec-json", "--rollout", "25", "--deny", "t1", "--reason", "pilot"],
        )
        capsys.readouterr()
        assert await asyncio.to_thread(main, [*common, "list"]) == 0
        piped = capsys.readouterr().out.splitlines()
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
        monkeypatch.setenv("COLUMNS", "200")
        assert await asyncio.to_thread(main, [*common, "list"]) == 0
        table = capsys.readouterr().out.splitlines()
    columns = ["flag", "enabled", "rollout", "tenants", "source", "rules"]
    assert piped[0].split("\t") == columns
    assert sorted(line.split("\t") for line in piped[1:]) == [
        ["spec-json", "on", "25% of tenants", "deny t1", "ops", "json"],
        ["speculation", "on", "-", "all", "implicit", "-"],
    ]
    head = re.sub(r"\x1b\[[0-9;]*m", "", next(line for line in table if "flag" in line))
    assert [cell.strip() for cell in head.strip("┃│ ").split("┃") if cell.strip()] == columns


async def test_a_misspelt_flag_is_refused_with_a_suggestion(tmp_path, capsys):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        common = ["flags", "--gateway", url, "--token", TOKEN]
        typo = await asyncio.to_thread(
            main, [*common, "set", "speculaton", "--off", "--reason", "x"]
        )
        assert await served_by(c, url, CHAT) == "spec"  # nothing changed
        created = await asyncio.to_thread(
            main, [*common, "set", "brand-new", "--create", "--reason", "x"]
        )
        again = await asyncio.to_thread(
            main, [*common, "set", "brand-new", "--off", "--reason", "x"]
        )
        audit = (await c.get(url + "/admin/audit", headers=AUTH)).json()["audit"]
    err = capsys.readouterr().err
    assert typo == 1 and "Did you mean 'speculation'?" in err
    assert created == 0 and again == 0  # once created, the name is known
    assert [a["flag"] for a in audit] == ["brand-new", "brand-new"]


async def test_flags_cli_without_a_token_says_so(capsys, monkeypatch):
    monkeypatch.delenv("SPECLANE_ADMIN_TOKEN", raising=False)
    code = await asyncio.to_thread(main, ["flags", "--gateway", "http://127.0.0.1:9", "list"])
    assert code == 1
    assert "no admin token: pass --token or set SPECLANE_ADMIN_TOKEN" in capsys.readouterr().err


KEYLESS = POLICY.split("tenants:")[0]  # no tenant: every request is anonymous


async def test_a_keyless_gateway_refuses_a_partial_rollout_and_every_change_needs_a_reason(
    tmp_path,
):
    """A rollout draws tenants (a hash of the tenant), and a request without a known key is
    in no partial rollout: where no request can have a tenant, 50% would be 0%, so it is
    refused with how to fix it; a change without a reason is refused, as the console does."""
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), KEYLESS, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        flag = url + "/admin/flags/speculation"
        half = await c.put(flag, json={"rollout": 50, "reason": "pilot"}, headers=AUTH)
        silent = await c.put(flag, json={"enabled": False, "reason": "  "}, headers=AUTH)
        unsaid = await c.delete(flag, headers=AUTH)
        full = await c.put(flag, json={"rollout": 100, "reason": "all"}, headers=AUTH)
        assert await served_by(c, url, CHAT) == "spec"
    assert half.status_code == 400 and half.json()["error"]["param"] == "rollout"
    assert "a rollout draws from tenants, and this gateway knows none" in half.text
    assert "api_keys" in half.text
    assert silent.status_code == unsaid.status_code == 400
    assert silent.json()["error"]["param"] == "reason"
    assert full.status_code == 200


async def test_a_request_outside_a_rollout_is_not_told_kill_switch(tmp_path, capsys):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (url, _),
        httpx.AsyncClient() as c,
    ):
        common = ["flags", "--gateway", url, "--token", TOKEN]
        args = [*common, "set", "speculation", "--rollout", "50", "--reason", "pilot"]
        assert await asyncio.to_thread(main, args) == 0
        anonymous = await c.post(url + "/v1/chat/completions", json=CHAT)
        no_reason = await asyncio.to_thread(_exit_code, [*common, "set", "speculation", "--off"])
        blank = await asyncio.to_thread(
            _exit_code, [*common, "set", "speculation", "--off", "--reason", " "]
        )
    reason = anonymous.headers["x-speclane-reason"]
    assert "kill switch" not in reason
    assert reason.startswith(
        "flag speculation: outside its 50% rollout of tenants; a request without a known API "
        "key is in no partial rollout; temperature 1 assumed"
    )
    out = capsys.readouterr()
    assert "50% of tenants" in out.out
    assert no_reason == blank == 2 and "say why, for the audit log" in out.err


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    return int(stopped.value.code or 0)


async def test_explain_says_offline_flags_are_the_files_and_reads_live_ones_with_gateway(
    tmp_path, capsys, monkeypatch
):
    """Offline, explain cannot know the kill switch ops set: it says so, and ``--gateway``
    reads the live flags (here found through SPECLANE_GATEWAY, as ``flags list`` does)."""
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app(), POLICY, admin_token=TOKEN) as (
        url,
        services,
    ):
        assert services.policy.path is not None
        policy = str(services.policy.path)
        off = ["flags", "--token", TOKEN, "set", "speculation", "--off", "--reason", "incident"]
        monkeypatch.setenv("SPECLANE_GATEWAY", url)
        assert await asyncio.to_thread(main, off) == 0
        capsys.readouterr()
        why = ["policy", "explain", policy, "--features", "temperature=0.2"]
        assert await asyncio.to_thread(main, why) == 0
        offline = capsys.readouterr().out
        live = [*why, "--gateway", url, "--token", TOKEN]
        assert await asyncio.to_thread(main, live) == 0
        online = capsys.readouterr().out
        wrong = [*why, "--gateway", url, "--token", "nope"]
        assert await asyncio.to_thread(main, wrong) == 1
        refused = capsys.readouterr().err
    assert "flag speculation: on" in offline and "pool: spec" in offline
    assert "flags from: the policy file's defaults: live flags (speclane flags) are not " in (
        offline
    )
    assert "--gateway URL reads them" in offline
    assert "flag speculation: off" in online and "pool: standard" in online
    assert "reason: kill switch: speculation is off" in online
    assert f"flags from: live, from {url}" in online
    assert f"{url}: admin API: wrong token (403): pass the gateway's" in refused
