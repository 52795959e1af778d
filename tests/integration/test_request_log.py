"""The gateway's request log and ``speclane replay --log``: what a real gateway wrote
replays through the decision code, and the log never holds an API key."""

from __future__ import annotations

import json

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from gateway.cli.main import main
from tests.gateways import sim_policy, sim_stack

pytestmark = pytest.mark.anyio

SIM = SimConfig(mode=Mode.SPECULATIVE, k=4, served_model_names=("qwen3-32b",), time_scale=0.01)
SCENARIO = """
version: 1
name: logged
duration_s: 60
traffic: [{name: unused, workload: chat, temperature: 0.5, rate: 1}]
"""


async def test_logged_requests_replay(tmp_path, capsys):
    log = tmp_path / "requests.jsonl"
    async with (
        sim_stack(tmp_path, sim_policy(), SIM, request_log=log) as (url, services, _),
        httpx.AsyncClient() as c,
    ):
        for i in range(5):
            body = {
                "model": "qwen3-32b",
                "messages": [{"role": "user", "content": f"Plan a weekend away, idea {i}"}],
                "temperature": 0.5,
                "max_tokens": 16,
            }
            headers = {"authorization": "Bearer sk-secret-key", "x-speclane-endpoint": "trip"}
            r = await c.post(url + "/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200
        unknown = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
        r = await c.post(url + "/v1/chat/completions", json=unknown)
        assert r.status_code == 404
        assert services.request_log is not None
        services.request_log.flush()
    text = log.read_text()
    assert "sk-secret-key" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 6 and lines[5]["body"]["model"] == "no-such-model"
    assert lines[0]["headers"]["x-speclane-endpoint"] == "trip"
    assert lines[0]["body"]["messages"][0]["content"].startswith("Plan a weekend")

    scenario = tmp_path / "logged.yaml"
    scenario.write_text(SCENARIO)
    policy = tmp_path / "replay-policy.yaml"
    policy.write_text(sim_policy().format(spec="http://a:1", std="http://b:1"))
    out = tmp_path / "out"
    args = ["replay", "--policy", str(policy), "--scenario", str(scenario), "--log", str(log)]
    assert main([*args, "--out", str(out)]) == 0
    summary = json.loads((out / "logged.json").read_text())
    assert summary["requests"] == 5 and {c["traffic"] for c in summary["cells"]} == {"default"}
    why = "model 'no-such-model' is not on the ladder replayed (qwen3-32b)"
    assert summary["skipped"] == {why: 1}
    assert f"logged: left out 1 logged request(s): {why}" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    assert (
        main(["replay", "--policy", str(policy), "--scenario", str(scenario), "--log", str(bad)])
        == 1
    )
