"""The console's shell and the admin routes it is built on: pools, the policy's source and
version, lint, explain side by side, and apply through the reload path (refused when off,
stale or read-only)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.apis import APIS
from gateway.server.console.routes import CSP
from tests.fakes import FakeUpstream
from tests.gateways import fake_stack

pytestmark = pytest.mark.anyio

TOKEN = "console-token"
AUTH = {"authorization": f"Bearer {TOKEN}", "x-speclane-actor": "alice"}
POLICY = """version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: tiny, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules:
  - name: json
    match: {{response_format: [json_object]}}
    start: spec
  - {{name: default, start: spec}}
"""
JSON_REQUEST = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "as JSON"}],
    "response_format": {"type": "json_object"},
}


def stack(tmp_path: Path, **overrides: object):
    fake = FakeUpstream()
    settings = {"admin_token": TOKEN, **overrides}
    return fake_stack(tmp_path, fake.app(), fake.app(), POLICY, **settings)


async def test_the_console_is_served_only_with_the_admin_api_and_under_a_strict_csp(tmp_path):
    async with stack(tmp_path) as (url, _), httpx.AsyncClient() as c:
        bare = await c.get(url + "/console")
        shell = await c.get(url + "/console/")
        script = await c.get(url + "/console/static/main.js")
        again = await c.get(
            url + "/console/static/main.js", headers={"if-none-match": script.headers["etag"]}
        )
        missing = await c.get(url + "/console/static/nope.js")
        sneaky = await c.get(url + "/console/static/..%2Fadmin")
    assert bare.status_code == 308 and bare.headers["location"] == "console/"
    assert shell.status_code == 200 and shell.headers["content-type"].startswith("text/html")
    assert 'src="static/main.js"' in shell.text and TOKEN not in shell.text
    assert script.headers["content-type"].startswith("text/javascript")
    assert again.status_code == 304
    assert missing.status_code == 404 and sneaky.status_code == 404
    for response in (shell, script, missing):
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
    directives = dict(d.split(" ", 1) for d in CSP.split("; "))
    assert directives["default-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in CSP


@pytest.mark.parametrize("overrides", [{"admin_token": None}, {"console": False}])
async def test_the_console_is_off_without_the_admin_api_or_when_turned_off(tmp_path, overrides):
    async with stack(tmp_path, **overrides) as (url, _), httpx.AsyncClient() as c:
        answers = [await c.get(url + path) for path in ("/console", "/console/", "/console/x.js")]
        metrics = (await c.get(url + "/metrics")).text
    hint = "SPECLANE_ADMIN_TOKEN" if "admin_token" in overrides else "SPECLANE_CONSOLE=false"
    for answer in answers:
        assert answer.status_code == 404
        assert answer.text.startswith("speclane's ops console is off: ") and hint in answer.text
    assert "speclane_request_errors_total{" not in metrics


async def test_pools_show_endpoints_and_need_the_token(tmp_path):
    async with stack(tmp_path) as (url, _), httpx.AsyncClient() as c:
        refused = await c.get(url + "/admin/pools")
        pools = (await c.get(url + "/admin/pools", headers=AUTH)).json()["pools"]
    assert refused.status_code == 401
    assert pools["spec"]["kind"] == "speculative" and pools["spec"]["num_speculative_tokens"] == 4
    assert pools["standard"]["healthy"] is True
    assert [e["url"] for e in pools["standard"]["endpoints"]] and pools["spec"]["scraped"] is None


async def test_stats_carry_what_the_live_view_shows(tmp_path):
    """The console's live view reads these fields; a redesign of /admin/stats keeps them."""
    async with stack(tmp_path) as (url, _), httpx.AsyncClient() as c:
        for _ in range(3):
            response = await c.post(url + "/v1/chat/completions", json=JSON_REQUEST)
            assert response.status_code == 200
        slices = (await c.get(url + "/admin/stats", headers=AUTH)).json()["slices"]
        events = (await c.get(url + "/admin/guardrail", headers=AUTH)).json()
    (key,) = [k for k in slices if k.startswith("json /")]
    shown = slices[key]
    assert (shown["rule"], shown["phase"], shown["start"], shown["rung"]) == (
        "json",
        "on",
        "spec",
        "spec",
    )
    assert shown["probing"] is None and shown["requests_per_s"] > 0
    assert shown["pools"]["spec"]["requests"] == 3
    assert events["events"] == [] and isinstance(events["slices"], dict)


async def test_source_names_the_running_version_and_the_last_reload(tmp_path):
    async with stack(tmp_path) as (url, services), httpx.AsyncClient() as c:
        path = services.policy.path
        assert path is not None
        first = (await c.get(url + "/admin/policy/source", headers=AUTH)).json()
        path.write_text(path.read_text() + "bogus: 1\n")
        rejected = await c.post(url + "/admin/policy/reload", headers=AUTH)
        after = (await c.get(url + "/admin/policy/source", headers=AUTH)).json()
    assert first["version"] == hashlib.sha256(first["text"].encode()).hexdigest()[:12]
    assert first["file"]["same"] is True and first["file"]["text"] is None
    assert first["apply"] == {"enabled": False, "blocked": first["apply"]["blocked"]}
    assert "SPECLANE_POLICY_APPLY" in first["apply"]["blocked"]
    assert rejected.status_code == 422
    assert after["version"] == first["version"]  # the bad file did not replace the policy
    assert after["last_reload"]["ok"] is False and "bogus" in after["last_reload"]["errors"][0]
    assert after["file"]["same"] is False and after["file"]["text"].endswith("bogus: 1\n")


async def test_lint_places_every_problem_and_bounds_the_body(tmp_path):
    draft = POLICY.format(spec="http://a", std="http://b").replace(
        "start: spec\n", "start: spek\n", 1
    )
    async with stack(tmp_path) as (url, _), httpx.AsyncClient() as c:
        linted = (
            await c.post(url + "/admin/policy/lint", json={"text": draft}, headers=AUTH)
        ).json()
        garbage = await c.post(url + "/admin/policy/lint", json={"text": "\x00: [{"}, headers=AUTH)
        wrong = await c.post(url + "/admin/policy/lint", json={"txt": ""}, headers=AUTH)
        huge = await c.post(
            url + "/admin/policy/lint", content=b'{"text": "' + b"a" * 3_000_000, headers=AUTH
        )
        refused = await c.post(url + "/admin/policy/lint", json={"text": draft})
    line = draft.splitlines().index("    start: spek") + 1
    (problem,) = linted["problems"]
    assert (problem["line"], problem["severity"], linted["errors"]) == (line, "error", 1)
    assert "spek" in problem["message"] and problem["path"] == "rules.0.start"
    assert garbage.status_code == 200 and garbage.json()["errors"] >= 1
    assert wrong.status_code == 400 and huge.status_code == 413 and refused.status_code == 401


async def test_explain_shows_the_running_policy_and_the_draft_side_by_side(tmp_path):
    async with stack(tmp_path) as (url, services), httpx.AsyncClient() as c:
        running_text = services.policy.text
        assert running_text is not None
        draft = running_text.replace("start: spec\n", "start: standard\n", 1)
        body = {"request": JSON_REQUEST, "draft": draft, "headers": {"X-Speclane-Tenant": "t1"}}
        both = (await c.post(url + "/admin/policy/explain", json=body, headers=AUTH)).json()
        broken = await c.post(
            url + "/admin/policy/explain",
            json={"request": JSON_REQUEST, "draft": "rules: 3"},
            headers=AUTH,
        )
        bad_request = await c.post(
            url + "/admin/policy/explain", json={"request": {"messages": []}}, headers=AUTH
        )
    running, drafted = both["running"], both["draft"]
    assert (running["rule"], running["pool"]) == ("json", "spec")
    assert (drafted["rule"], drafted["pool"]) == ("json", "standard")
    assert running["features"]["tenant"] == "t1"
    assert broken.status_code == 200 and broken.json()["draft"]["problems"]
    assert bad_request.status_code == 400
    assert bad_request.json()["error"]["param"].startswith("request")


async def test_explain_takes_the_endpoint_as_a_short_name_or_a_path(tmp_path):
    completion = {"model": "tiny", "prompt": "Say hi", "temperature": 0.5}
    async with stack(tmp_path) as (url, _), httpx.AsyncClient() as c:
        answers = [
            await c.post(
                url + "/admin/policy/explain",
                json={"request": completion, "endpoint": endpoint},
                headers=AUTH,
            )
            for endpoint in ("completions", "/v1/completions", "nope")
        ]
    short, path, unknown = answers
    assert short.status_code == 200 and short.json() == path.json()
    assert short.json()["running"]["features"]["endpoint"] == "/v1/completions"
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "endpoint"
    assert "chat, /v1/chat/completions, completions" in unknown.json()["error"]["message"]


MESSAGES_REQUEST = {
    "model": "tiny",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "Extract the fields as JSON"}],
    "temperature": 0.1,
}
RESPONSES_REQUEST = {
    "model": "tiny",
    "input": "Extract the fields as JSON",
    "temperature": 0.1,
    "text": {"format": {"type": "json_schema", "name": "f", "schema": {"type": "object"}}},
}
AGENTS = "  - name: agents\n    match: {endpoint: [messages, responses]}\n    start: standard\n"


@pytest.mark.parametrize(
    ("endpoint", "request_body"),
    [("messages", MESSAGES_REQUEST), ("/v1/responses", RESPONSES_REQUEST)],
)
async def test_explain_takes_messages_and_responses_bodies(tmp_path, endpoint, request_body):
    """What the console's form offers for Anthropic's Messages and OpenAI's Responses: each
    body read as its API reads it, against the running policy and a draft."""
    async with stack(tmp_path) as (url, services), httpx.AsyncClient() as c:
        running_text = services.policy.text or ""
        draft = running_text.replace("rules:\n", "rules:\n" + AGENTS, 1)
        body = {"request": request_body, "endpoint": endpoint, "draft": draft}
        answer = await c.post(url + "/admin/policy/explain", json=body, headers=AUTH)
        chat_shaped = await c.post(
            url + "/admin/policy/explain",
            json={"request": JSON_REQUEST, "endpoint": endpoint},
            headers=AUTH,
        )
    assert answer.status_code == 200, answer.text
    running, drafted = answer.json()["running"], answer.json()["draft"]
    path = "/v1/messages" if endpoint == "messages" else endpoint
    assert running["features"]["endpoint"] == drafted["features"]["endpoint"] == path
    assert (running["rule"], running["pool"]) == ("default", "spec")
    assert (drafted["rule"], drafted["pool"]) == ("agents", "standard")
    assert running["features"]["temperature"] == 0.1
    if endpoint == "/v1/responses":  # text.format is the response format there
        assert running["features"]["response_format"] == "json_schema"
    assert chat_shaped.status_code == 400  # a chat body is not a Messages or Responses one
    assert chat_shaped.json()["error"]["param"].startswith("request")


async def test_the_explain_form_offers_every_api_with_a_body_of_its_own(tmp_path):
    async with stack(tmp_path) as (url, _), httpx.AsyncClient() as c:
        shell = (await c.get(url + "/console/")).text
        script = (await c.get(url + "/console/static/policy.js")).text
    menu = shell.split('<select id="sample-endpoint">', 1)[1].split("</select>", 1)[0]
    offered = re.findall(r'<option value="([a-z]+)">', menu)
    assert offered == [api.name for api in APIS]
    samples = script.split("const SAMPLES = {", 1)[1].split("};", 1)[0]
    assert [line.strip().split(":", 1)[0] for line in samples.strip().splitlines()] == offered


async def test_apply_is_refused_unless_turned_on(tmp_path):
    async with stack(tmp_path) as (url, services), httpx.AsyncClient() as c:
        text = (services.policy.text or "") + "# a comment\n"
        dry = await c.post(
            url + "/admin/policy/apply", json={"text": text, "dry_run": True}, headers=AUTH
        )
        real = await c.post(url + "/admin/policy/apply", json={"text": text}, headers=AUTH)
    assert dry.status_code == 200 and "+# a comment" in dry.json()["diff"]
    assert dry.json()["blocked"] and dry.json()["applied"] is False
    assert real.status_code == 403 and real.json()["error"]["code"] == "policy_apply_disabled"


async def test_apply_writes_the_file_and_reloads_it(tmp_path):
    async with stack(tmp_path, policy_apply=True) as (url, services), httpx.AsyncClient() as c:
        path = services.policy.path
        assert path is not None
        source = (await c.get(url + "/admin/policy/source", headers=AUTH)).json()
        assert source["apply"]["blocked"] is None
        draft = source["text"].replace("start: spec\n", "start: standard\n", 1)
        base = source["file"]["version"]
        invalid = await c.post(
            url + "/admin/policy/apply",
            json={"text": "rules: 3", "base_version": base},
            headers=AUTH,
        )
        unsaid = await c.post(
            url + "/admin/policy/apply",
            json={"text": draft, "base_version": base, "reason": "  "},
            headers=AUTH,
        )
        assert path.read_text() == source["text"]  # nobody said why: nothing written
        applied = await c.post(
            url + "/admin/policy/apply",
            json={"text": draft, "base_version": base, "reason": "json to standard"},
            headers=AUTH | {"x-speclane-actor": "ana"},
        )
        stale = await c.post(
            url + "/admin/policy/apply",
            json={"text": source["text"], "base_version": base},
            headers=AUTH,
        )
        served = await c.post(url + "/v1/chat/completions", json=JSON_REQUEST)
        audit = (await c.get(url + "/admin/audit", headers=AUTH)).json()["audit"]
    assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "policy_invalid"
    assert unsaid.status_code == 400 and unsaid.json()["error"]["param"] == "reason"
    assert applied.status_code == 200, applied.text
    assert applied.json()["applied"] and applied.json()["reloaded"]
    assert path.read_text() == draft and services.policy.text == draft
    assert services.policy.version == applied.json()["version"]
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "policy_changed"
    assert served.headers["x-speclane-pool"] == "standard"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".policy.yaml.")]
    (change,) = audit  # only what was applied: refusals change nothing
    assert change["who"] == "ana" and change["reason"] == "json to standard"
    assert change["policy"] == f"{base} -> {applied.json()['version']}"


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """A folder nothing can write in, as a ConfigMap mount is; root ignores permission bits,
    so as root the folder is made immutable instead."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    if made.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot make {folder} read-only: {made.stderr.decode()}")
        pytest.skip(f"cannot make {folder} read-only here: {made.stderr.decode()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


async def test_apply_to_a_read_only_file_says_why_and_changes_nothing(tmp_path):
    folder = tmp_path / "mount"
    folder.mkdir()
    async with stack(folder, policy_apply=True) as (url, services), httpx.AsyncClient() as c:
        text = services.policy.text or ""
        with read_only(folder):
            source = (await c.get(url + "/admin/policy/source", headers=AUTH)).json()
            refused = await c.post(
                url + "/admin/policy/apply", json={"text": text + "# x\n"}, headers=AUTH
            )
        assert "read-only" in source["apply"]["blocked"]
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "policy_read_only"
        assert "kubectl apply" in refused.json()["error"]["message"]
        assert services.policy.path is not None and services.policy.path.read_text() == text
