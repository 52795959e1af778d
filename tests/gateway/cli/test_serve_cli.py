"""``speclane --version`` and what ``speclane serve`` writes to its log: timestamps on every
line, and one access-log line per request when asked."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import httpx
import pytest

from gateway.cli.main import main
from tests.fakes import FakeUpstream
from tests.gateways import policy_yaml
from tests.servers import free_port, serving

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"speclane \d+\.\d+\.\d+.*\n", capsys.readouterr().out)


@pytest.mark.anyio
async def test_serve_logs_carry_timestamps_and_the_access_log_is_an_option(tmp_path):
    fake = FakeUpstream()
    async with serving(fake.app()) as spec, serving(fake.app()) as std:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_yaml([spec], [std]))
        port = free_port()
        command = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy)]
        command += ["--port", str(port), "--access-log", "--log-level", "info"]
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        try:
            async with httpx.AsyncClient() as c:
                url = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 15
                while True:
                    assert process.poll() is None, "gateway exited"
                    try:
                        if (await c.get(url + "/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, "gateway did not start"
                        await asyncio.sleep(0.1)
                body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
                assert (await c.post(url + "/v1/chat/completions", json=body)).status_code == 200
        finally:
            process.terminate()
            _, err = process.communicate(timeout=30)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and all(STAMP.match(line) for line in lines), lines
    assert any('"POST /v1/chat/completions HTTP/1.1" 200' in line for line in lines), lines
    said = [
        line.split("gateway.cli.serve: ", 1)[1] for line in lines if "gateway.cli.serve: " in line
    ]
    assert said[0] == f"listening on http://127.0.0.1:{port} (1 worker)"
    assert said[1].startswith(f"policy {policy} (version ")
    assert said[1].endswith("ladder tiny: spec > standard; 1 rule (default)")
    assert said[2:4] == [
        f"pool spec: speculative k=4 on vllm, model tiny, endpoints {spec}",
        f"pool standard: standard on vllm, model tiny, endpoints {std}",
    ]
    assert said[4].startswith("routes: POST /v1/chat/completions, POST /v1/completions")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SPECLANE_LOG_LEVEL": "chatty"}, "SPECLANE_LOG_LEVEL: Input should be 'critical'"),
        ({"SPECLANE_PORT": "eighty"}, "SPECLANE_PORT: Input should be a valid integer"),
        ({"SPECLANE_MAX_BODY_BYTES": "1"}, "SPECLANE_MAX_BODY_BYTES: Input should be greater"),
    ],
)
def test_a_bad_setting_is_one_clear_line(monkeypatch, capsys, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"speclane serve: {message}") and "Traceback" not in err


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"version: 1\x00\n", "not valid YAML: character '\\x00' is not allowed"),
        (b"version: \xff\n", "not UTF-8 text"),
        (b"a: " + b"{a: " * 10_000, "nested deeper than 64 levels"),
    ],
)
def test_serve_and_lint_explain_a_policy_that_does_not_load(tmp_path, capsys, data, message):
    policy = tmp_path / "policy.yaml"
    policy.write_bytes(data)
    assert main(["serve", "--policy", str(policy)]) == 1
    assert main(["policy", "lint", str(policy)]) == 1
    out = capsys.readouterr()
    assert out.err.count(message) == 1 and out.out.count(message) == 1
    assert "Traceback" not in out.err + out.out
    assert main(["serve", "--policy", str(tmp_path)]) == 1
    assert "cannot read the policy" in capsys.readouterr().err


def test_trace_is_a_log_level():
    from gateway.settings import Settings

    assert Settings(log_level="TRACE").log_level == "trace"


def test_a_port_in_use_is_one_line_before_any_banner(tmp_path, capsys):
    import socket

    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--policy", str(policy), "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"speclane serve: cannot listen on 127.0.0.1:{port}: Address already in use\n"
