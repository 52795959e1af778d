"""The ops console in headless Chromium, against a real gateway in front of the simulated
vLLM: sign in, watch a slice fall back during an induced collapse, flip the kill switch
with a reason and see requests move to standard, lint a broken draft and see the error at
its line, explain and apply a draft, and use it all on a phone-sized screen."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from gateway.state.policyfile import version_of
from tests.browser.conftest import chromium, screenshot_dir
from tests.gateways import Stack, sim_stack

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

TOKEN = "console-browser-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
MIN_SAMPLES = 8
POLICY = """version: 1
pools:
  spec: {{kind: speculative, model: qwen3-32b, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
guardrail:
  mode: threshold
  min_acceptance: 0.4
  recover_above: 0.5
  min_samples: 8
  window_s: 60
  cooldown_s: 300
flags:
  spec-json: {{enabled: true, description: structured output on speculation}}
rules:
  - name: json
    match: {{response_format: [json_object]}}
    start: spec
    flag: spec-json
  - name: code
    match: {{endpoint: [code-assist]}}
    start: spec
  - {{name: default, start: spec}}
"""
SIM = SimConfig(mode=Mode.SPECULATIVE, k=4, served_model_names=("qwen3-32b",), time_scale=0.01)
CODE = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "Complete this python function:\ndef add(a, b):"}],
    "temperature": 0,
    "max_tokens": 24,
}
JSON_BODY = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "Extract name and age as JSON: Bob, 3"}],
    "temperature": 0.1,
    "max_tokens": 24,
    "response_format": {"type": "json_object"},
}
CODE_HEADERS = {"x-speclane-endpoint": "code-assist"}


class Console(NamedTuple):
    stack: Stack
    page: Any
    http: httpx.AsyncClient
    errors: list[str]


@asynccontextmanager
async def console(tmp_path: Path, viewport: dict[str, int] = DESKTOP) -> AsyncIterator[Console]:
    """Gateway + simulators + Chromium on the console's sign-in page."""
    async with (
        sim_stack(
            tmp_path, POLICY, SIM, admin_token=TOKEN, policy_apply=True, scrape_interval_s=1
        ) as stack,
        chromium(viewport) as browser,
        httpx.AsyncClient(timeout=10) as http,
    ):
        page = browser.pages[0] if browser.pages else await browser.new_page()
        page.set_default_timeout(10_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        await page.goto(stack.url + "/console")
        yield Console(stack, page, http, errors)
    # refused tokens show up as failed loads; anything else (CSP, Trusted Types) is a bug
    assert [e for e in errors if "Failed to load resource" not in e] == []


async def sign_in(page: Any, token: str = TOKEN, name: str = "alice") -> None:
    """Sign in; ``name`` goes to the audit log as "<name> (console)"."""
    await page.fill("#token", token)
    await page.fill("#actor", name)
    await page.click("#login-form button[type=submit]")


async def send(c: Console, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    response = await c.http.post(c.stack.url + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.headers["x-speclane-pool"]


async def shoot(page: Any, name: str) -> None:
    folder = screenshot_dir()
    if folder is not None:
        await page.evaluate("window.scrollTo(0, 0)")
        await page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


async def test_sign_in_keeps_the_token_in_memory_only(tmp_path):
    from playwright.async_api import expect

    async with console(tmp_path) as c:
        page = c.page
        await expect(page.locator("#login")).to_be_visible()
        for view in ("#live", "#flags", "#policy", "#tabs", "#kill"):
            await expect(page.locator(view)).to_be_hidden()
        await sign_in(page, token="not-the-token")
        await expect(page.locator("#login-error")).to_have_text("That token was refused.")
        await sign_in(page, name="Łukasz")  # a name no header can carry as it is
        await expect(page.locator("#live")).to_be_visible()
        await expect(page.locator("#kill")).to_have_text("Speculation on")
        await expect(page.locator("#status")).to_contain_text("updated")
        kept = await page.evaluate("() => [localStorage.length, sessionStorage.length]")
        assert kept == [0, 0] and await c.page.context.cookies() == []
        assert TOKEN not in await page.content()
        # the page runs under Trusted Types: text can never become markup
        refused = await page.evaluate(
            "() => { try { document.body.innerHTML = '<b>x</b>'; return 'parsed' }"
            " catch (e) { return e.name } }"
        )
        assert refused == "TypeError"
        blocked = [e for e in c.errors if "TrustedHTML" in e]
        assert len(blocked) == 1  # the one just provoked, which the page itself never causes
        c.errors.remove(blocked[0])
        await page.reload()
        await expect(page.locator("#login")).to_be_visible()
        await expect(page.locator("#live")).to_be_hidden()


async def test_a_slice_falls_back_during_a_collapse(tmp_path):
    from playwright.async_api import expect

    async with console(tmp_path) as c:
        for _ in range(MIN_SAMPLES + 2):
            assert await send(c, CODE, CODE_HEADERS) == "spec"
            await send(c, JSON_BODY)
        await sign_in(c.page)
        card = c.page.locator("article.slice[data-slice^='code /']")
        await expect(card).to_have_attribute("data-phase", "on")
        await expect(card.locator(".rung")).to_have_text("on spec")
        await expect(c.page.locator("article.pool[data-pool='spec']")).to_contain_text("healthy")

        await c.http.post(c.stack.spec + "/sim/control", json={"acceptance": {"code": 0.05}})
        served = [await send(c, CODE, CODE_HEADERS) for _ in range(2 * MIN_SAMPLES)]
        assert served[-1] == "standard", served
        await expect(card).to_have_attribute("data-phase", "fallen_back")
        await expect(card.locator(".rung")).to_have_text("fallen back to standard")
        await card.locator("summary").click()
        await expect(card.locator("ol.events li")).to_contain_text("fallen back")
        json_card = c.page.locator("article.slice[data-slice^='json /']")
        await expect(json_card).to_have_attribute("data-phase", "on")
        await c.page.wait_for_timeout(2500)  # the next refresh keeps the opened details open
        await expect(card.locator("ol.events")).to_be_visible()
        await shoot(c.page, "live")


async def test_the_kill_switch_asks_why_and_moves_traffic_to_standard(tmp_path):
    from playwright.async_api import expect

    async with console(tmp_path) as c:
        page = c.page
        assert await send(c, CODE, CODE_HEADERS) == "spec"
        await sign_in(page)
        await page.click("#kill")
        dialog = page.locator("#dialog")
        await expect(dialog).to_be_visible()
        await expect(dialog.locator("#dialog-changes")).to_contain_text("state: on → off")
        await expect(dialog.locator("#dialog-ok")).to_be_disabled()  # no reason yet
        await page.fill("#dialog-reason", "incident 77: draft pool overloaded")
        await dialog.locator("#dialog-ok").click()
        await expect(dialog).to_be_hidden()
        await expect(page.locator("#kill")).to_have_class("kill off")
        assert {await send(c, CODE, CODE_HEADERS) for _ in range(5)} == {"standard"}

        await page.click("a[href='#flags']")
        latest = page.locator("#audit tbody tr").first
        await expect(latest).to_contain_text("incident 77: draft pool overloaded")
        await expect(latest).to_contain_text("alice (console)")
        await shoot(page, "flags")

        # changed elsewhere (another replica, the CLI): the console follows within seconds
        body = {"enabled": True, "reason": "incident 77 over"}
        changed = await c.http.put(
            c.stack.url + "/admin/flags/speculation", json=body, headers=AUTH
        )
        assert changed.status_code == 200
        await expect(page.locator("#kill")).to_have_class("kill", timeout=5000)
        await expect(page.locator("#audit tbody tr").first).to_contain_text("incident 77 over")
        assert await send(c, CODE, CODE_HEADERS) == "spec"


async def test_a_broken_draft_shows_its_error_at_its_line_and_a_good_one_applies(tmp_path):
    from playwright.async_api import expect

    async with console(tmp_path) as c:
        page = c.page
        await sign_in(page)
        await page.click("a[href='#policy']")
        version = page.locator("#version")
        await expect(version).to_have_text(c.stack.services.policy.version or "")
        running = await page.input_value("#draft")
        assert running == c.stack.services.policy.text

        broken = running.replace("start: spec\n", "start: spek\n", 1)
        line = broken.splitlines().index("    start: spek") + 1
        await page.fill("#draft", broken)
        await page.click("#lint")
        problem = page.locator(f"#problems li.error[data-line='{line}']")
        await expect(problem).to_contain_text(f"line {line}")
        await expect(problem).to_contain_text("spek")
        await expect(page.locator(f"#gutter span[data-line='{line}']")).to_have_class("error")
        await problem.click()
        caret_line = await page.evaluate(
            "() => { const a = document.getElementById('draft');"
            " return a.value.slice(0, a.selectionStart).split('\\n').length }"
        )
        assert caret_line == line
        await shoot(page, "policy")

        code_to_standard = running.replace(
            "    match: {endpoint: [code-assist]}\n    start: spec\n",
            "    match: {endpoint: [code-assist]}\n    start: standard\n",
        )
        await page.fill("#draft", code_to_standard)
        await page.click("#lint")
        await expect(page.locator("#problems li.summary")).to_have_text("No problems.")
        # the form offers every API, each with a body of its own for the model served
        for endpoint, field in (("messages", '"max_tokens":256'), ("responses", '"input"')):
            await page.select_option("#sample-endpoint", endpoint)
            await expect(page.locator("#sample")).to_have_value(re.compile(field))
            assert '"model":"qwen3-32b"' in await page.input_value("#sample")
            await page.click("#explain")
            features = page.locator("[data-side=running] details").nth(1)
            await expect(features).to_contain_text(f"/v1/{endpoint}")
        await page.select_option("#sample-endpoint", "chat")
        await page.fill(
            "#sample",
            '{"model": "qwen3-32b", "messages": [{"role": "user", "content": "def f():"}]}',
        )
        await page.fill("#sample-headers", '{"x-speclane-endpoint": "code-assist"}')
        await page.click("#explain")
        await expect(page.locator("[data-side=running] dd[data-key=pool]")).to_have_text("spec")
        draft_pool = page.locator("[data-side=draft] dd[data-key=pool]")
        await expect(draft_pool).to_have_text("standard")
        await expect(draft_pool).to_have_class("differs")

        await page.click("#apply")
        await expect(page.locator("#dialog-changes pre.diff")).to_contain_text(
            "+    start: standard"
        )
        await page.fill("#dialog-reason", "code to standard while the draft model is retrained")
        await page.click("#dialog-ok")
        await expect(page.locator("#dialog")).to_be_hidden()
        await expect(version).to_have_text(version_of(code_to_standard))
        assert c.stack.services.policy.text == code_to_standard
        assert await send(c, CODE, CODE_HEADERS) == "standard"


async def test_every_view_fits_a_phone_screen(tmp_path):
    from playwright.async_api import expect

    async with console(tmp_path, PHONE) as c:
        for _ in range(3):
            await send(c, CODE, CODE_HEADERS)
            await send(c, JSON_BODY)
        await sign_in(c.page)
        for view, ready in [
            ("live", "article.slice"),
            ("flags", "#killcard button"),
            ("policy", "#version"),
        ]:
            await c.page.click(f"a[href='#{view}']")
            await expect(c.page.locator(f"#{view} {ready}").first).to_be_visible()
            overflow = await c.page.evaluate(
                "() => document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"{view} is {overflow}px wider than the screen"
            await shoot(c.page, f"phone-{view}")
