"""A speculative server that dies fails over: new requests, streamed or not, all succeed on
the next rung, the client sees no error, and speclane says what happened (the reason header,
the failover counter, ``/readyz``). The server is started again afterwards by the same
``speclane local-vllm up``, which restarts only what is not running. The guardrail is pinned:
what is tested is the failover, not whether the slice would also be cheaper elsewhere."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli.localvllm.stackfile import StackState, policy_text
from tests.vllm.conftest import bring_up
from tests.vllm.serve import PINNED, sample, speclane_serve

pytestmark = pytest.mark.vllm


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def ask(client: Any, request: dict[str, Any], n: int) -> tuple[list[str], list[str]]:
    """``n`` requests, every other one streamed: the pool that served each, and why."""
    served, reasons = [], []
    for i in range(n):
        if i % 2:
            raw = client.chat.completions.with_raw_response.create(**request, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        else:
            raw = client.chat.completions.with_raw_response.create(**request)
            text = raw.parse().choices[0].message.content or ""
        served.append(raw.headers["x-speclane-pool"])
        reasons.append(raw.headers["x-speclane-reason"])
        assert text
    return served, reasons


def test_a_killed_speculative_server_fails_over(stack: StackState, stack_dir: Path, tmp_path):
    ngram = stack.server("ngram")
    assert ngram is not None
    request = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "def main("}],
        "temperature": 0,
        "max_tokens": 16,
    }
    try:
        with speclane_serve(tmp_path, policy_text(stack) + PINNED) as gateway:
            client = gateway.client()
            first = client.chat.completions.with_raw_response.create(**request)
            assert first.headers["x-speclane-pool"] == "ngram"
            os.killpg(ngram.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not refuses(ngram.port) and time.monotonic() < deadline:
                time.sleep(0.05)
            served, reasons = ask(client, request, 12)
            metrics = gateway.metrics()
            ready = httpx.get(gateway.url + "/readyz", timeout=10).json()
        assert "ngram" not in served
        assert all(r.startswith("failover: ngram ") for r in reasons), reasons
        assert all(f"served by {pool}" in r for r, pool in zip(reasons, served, strict=True))
        assert sample(metrics, "speclane_failovers_total", pool="ngram", result="served") == 12
        assert ready["pools"]["ngram"]["healthy"] is False
    finally:
        again = bring_up(stack_dir).server("ngram")
    assert again is not None and again.pid != ngram.pid
    assert again.port == ngram.port  # a running gateway's policy still points at it


def test_a_hung_speculative_server_times_out_fails_over_and_is_ejected(stack: StackState, tmp_path):
    """SIGSTOP: the kernel still accepts connections for the stopped server, so requests
    hang: a stream until the first-byte timeout, a whole answer (passed through: nothing
    shows before it is done) until the endpoint is ejected, by timed-out streams or by its
    metrics page not answering the gateway's reads. Then every request goes straight to the
    next rung. None of them reaches the client as an error."""
    ngram = stack.server("ngram")
    assert ngram is not None
    request = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "def main("}],
        "temperature": 0,
        "max_tokens": 16,
    }
    text = (policy_text(stack) + PINNED).replace(
        f"endpoints: [{ngram.url}]}}", f"endpoints: [{ngram.url}], timeouts: {{first_byte_s: 2}}}}"
    )
    assert "first_byte_s" in text
    # a server just restarted (the test before kills it) can take longer than first_byte_s
    # over its first request on a busy machine: that one goes to it directly
    httpx.post(ngram.url + "/v1/chat/completions", json=request, timeout=120).raise_for_status()
    settings = {"outlier_consecutive_failures": "3", "scrape_interval_s": "1"}
    with speclane_serve(tmp_path, text, **settings) as gateway:
        client = gateway.client()
        assert (
            client.chat.completions.with_raw_response.create(**request).headers["x-speclane-pool"]
            == "ngram"
        )
        os.killpg(ngram.pid, signal.SIGSTOP)
        try:
            served, reasons = ask(client, request, 10)
            ready = httpx.get(gateway.url + "/readyz", timeout=10).json()
        finally:
            os.killpg(ngram.pid, signal.SIGCONT)
    assert "ngram" not in served
    waited = [r for r in reasons if r.startswith("failover: ngram failed")]
    assert 1 <= len(waited) <= 3, reasons  # the rest skip the ejected endpoint
    assert all(r.startswith("failover: ngram ") for r in reasons), reasons
    assert ready["pools"]["ngram"]["healthy"] is False
