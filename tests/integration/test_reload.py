"""Hot reload against a running gateway: the file watch, SIGHUP, a bad file kept out, and
requests in flight finishing under the policy they started with."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.fakes import Behaviour, FakeUpstream
from tests.gateways import fake_stack, policy_yaml
from tests.servers import free_port, serving

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
TO_STANDARD = "\nrules:\n  - name: default\n    start: standard\n"


async def pool(c: httpx.AsyncClient, url: str) -> str:
    r = await c.post(url + "/v1/chat/completions", json=CHAT)
    return r.headers["x-speclane-pool"]


async def eventually(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.05)


async def test_file_change_reloads_and_a_bad_file_is_kept_out(tmp_path, caplog):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), policy_watch_s=0.05) as (url, svc),
        httpx.AsyncClient() as c,
    ):
        path = svc.policy.path
        good = path.read_text()
        assert await pool(c, url) == "spec"
        path.write_text(good.replace("start: spec", "start: spec\n    colour: red"))
        await eventually(lambda: _async(bool(svc.policy.last_error)))
        assert "unknown key 'colour'" in svc.policy.last_error[0]
        assert await pool(c, url) == "spec"
        metrics = (await c.get(url + "/metrics")).text
        assert "speclane_policy_reloads_total{" in metrics and 'result="rejected"' in metrics
        before = svc.policy.version
        caplog.set_level(logging.INFO, logger="gateway.state.policyfile")
        path.write_text(good.split("\nrules:")[0] + TO_STANDARD)

        async def switched() -> bool:
            return await pool(c, url) == "standard"

        await eventually(switched)
        assert svc.policy.last_error == ()
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.state.policyfile"]
    assert f"policy reloaded from {path}: version {before} -> {svc.policy.version}; " in said[-1]
    rules = ", ".join(rule.name for rule in svc.policy.current.rules)
    assert said[-1].endswith(f"rule{'s' if ',' in rules else ''} ({rules})")


async def _async(value: bool) -> bool:
    return value


async def test_requests_in_flight_keep_the_policy_they_started_with(tmp_path):
    slow = FakeUpstream(Behaviour(chunk_delay_s=0.05))
    async with (
        fake_stack(tmp_path, slow.app(), slow.app(), admin_token="t") as (url, svc),
        httpx.AsyncClient() as c,
    ):
        path = svc.policy.path
        body = {**CHAT, "stream": True}
        async with c.stream("POST", url + "/v1/chat/completions", json=body) as streaming:
            chunks = streaming.aiter_bytes()
            first = await anext(chunks)
            path.write_text(path.read_text().split("\nrules:")[0] + TO_STANDARD)
            reload = await c.post(
                url + "/admin/policy/reload", headers={"authorization": "Bearer t"}
            )
            assert reload.status_code == 200
            assert await pool(c, url) == "standard"  # new requests: the new policy
            rest = b"".join([chunk async for chunk in chunks])
        assert streaming.headers["x-speclane-pool"] == "spec"
        assert first and rest.endswith(b"data: [DONE]\n\n")


async def test_sighup_reloads_a_running_process(tmp_path):
    fake = FakeUpstream()
    async with serving(fake.app()) as spec, serving(fake.app()) as std:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_yaml([spec], [std]))
        port = free_port()
        env = {
            **os.environ,
            "SPECLANE_POLICY": str(policy),
            "SPECLANE_PORT": str(port),
            "SPECLANE_POLICY_WATCH_S": "3600",  # only the signal may reload
        }
        process = subprocess.Popen([sys.executable, "-m", "gateway", "serve"], env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient() as c:

                async def up() -> bool:
                    try:
                        return (await c.get(url + "/healthz")).status_code == 200
                    except httpx.TransportError:
                        return False

                await eventually(up, timeout=15)
                assert await pool(c, url) == "spec"
                policy.write_text(policy.read_text().split("\nrules:")[0] + TO_STANDARD)
                process.send_signal(signal.SIGHUP)

                async def switched() -> bool:
                    return await pool(c, url) == "standard"

                await eventually(switched)
        finally:
            process.terminate()
            process.wait(timeout=10)


HOSTILE = {
    "control character": b"version: 1\x00\n",
    "not UTF-8": b"version: 1\npools: \xff\n",
    "deep nesting": b"a: " + b"[" * 100_000,
    "alias bomb": "\n".join(
        ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    ).encode(),
}


async def test_hostile_files_are_rejected_and_the_watch_survives_them(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), policy_watch_s=0.05, admin_token="t") as (
            url,
            svc,
        ),
        httpx.AsyncClient() as c,
    ):
        path = svc.policy.path
        good = path.read_text()
        for name, data in HOSTILE.items():
            path.write_bytes(data)
            await eventually(lambda: _async(bool(svc.policy.last_error)))
            admin = await c.post(
                url + "/admin/policy/reload", headers={"authorization": "Bearer t"}
            )
            assert admin.status_code == 422, name
            assert admin.json()["errors"] == list(svc.policy.last_error), name
            assert await pool(c, url) == "spec", name  # still serving on the last good policy
            path.write_text(good)
            await eventually(lambda: _async(not svc.policy.last_error))
        path.unlink()
        path.mkdir()  # not even a file
        await eventually(lambda: _async(bool(svc.policy.last_error)))
        assert "cannot read" in svc.policy.last_error[0]
        path.rmdir()
        path.write_text(good.split("\nrules:")[0] + TO_STANDARD)

        async def switched() -> bool:
            return await pool(c, url) == "standard"

        await eventually(switched)  # the watch is alive: a later good file is loaded


async def test_a_reload_runs_off_the_event_loop(tmp_path):
    from gateway.state.policyfile import PolicyHolder

    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(["http://a:1"], ["http://b:1"]))
    holder = PolicyHolder.from_file(path)
    path.write_bytes(b"a: [" + b"1," * 40_000 + b"]")  # tens of milliseconds to refuse
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    before = ticks
    result = await holder.reload()
    ticker.cancel()
    assert not result.changed and result.errors
    assert ticks - before > 10  # the loop ran other work while the file was read


async def test_a_fifo_in_place_of_the_policy_file_is_refused_at_once(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), policy_watch_s=0.05, admin_token="t") as (
            url,
            svc,
        ),
        httpx.AsyncClient(headers={"authorization": "Bearer t"}, timeout=30) as c,
    ):
        path = svc.policy.path
        good = path.read_text()
        path.unlink()
        os.mkfifo(path)  # no writer will ever open it
        await eventually(lambda: _async(bool(svc.policy.last_error)))
        expected = f"{path}: cannot read: not a regular file but a FIFO (named pipe)"
        assert svc.policy.last_error == (expected,)
        admin = await c.post(url + "/admin/policy/reload")
        assert admin.status_code == 422 and admin.json()["errors"] == [expected]
        source = (await c.get(url + "/admin/policy/source")).json()
        assert "FIFO" in source["file"]["error"] and source["version"] == svc.policy.version
        assert await pool(c, url) == "spec"  # still serving on the last good policy
        path.unlink()
        path.write_text(good.split("\nrules:")[0] + TO_STANDARD)

        async def switched() -> bool:
            return await pool(c, url) == "standard"

        await eventually(switched)  # the watch is alive: a later good file is loaded
