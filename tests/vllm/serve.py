"""A real ``speclane serve`` child process for the real-vLLM tier, and what tests read from
the servers around it (vLLM's counters, the gateway's admin API and metrics)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from tests.servers import free_port


@dataclass(frozen=True)
class Gateway:
    url: str
    token: str
    log: Path

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="sk-test", max_retries=0, default_headers=headers
        )

    def admin(self, path: str) -> object:
        auth = {"authorization": f"Bearer {self.token}"}
        response = httpx.get(self.url + path, headers=auth, timeout=10)
        response.raise_for_status()
        return response.json()

    def window(self, rule: str, pool: str) -> dict[str, object]:
        """The live-stats window of ``rule``'s one slice on ``pool`` (from ``/admin/stats``)."""
        slices = self.admin("/admin/stats")["slices"]  # type: ignore[index]
        (window,) = [s["pools"][pool] for s in slices.values() if s["rule"] == rule]
        return dict(window)

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text


# Answers and signals are compared on the pool the endpoint header names, so the guardrail must
# not move a slice off it (the tiny draft model's acceptance is low enough that it would).
PINNED = "guardrail: {mode: threshold, min_acceptance: 0, recover_above: 0}\n"


@contextmanager
def speclane_serve(tmp: Path, policy: str, **settings: str) -> Iterator[Gateway]:
    """``speclane serve`` with ``policy`` on a free port until the block ends;
    ``settings`` are ``SPECLANE_*`` variables without the prefix."""
    port = free_port()
    token = secrets.token_urlsafe(12)
    (tmp / "policy.yaml").write_text(policy)
    log = tmp / "gateway.log"
    env = {f"SPECLANE_{k.upper()}": v for k, v in settings.items()}
    env |= {"SPECLANE_ADMIN_TOKEN": token, "SPECLANE_GRACEFUL_SHUTDOWN_S": "2"}
    argv = [sys.executable, "-m", "gateway", "serve", "--policy", str(tmp / "policy.yaml")]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*argv, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    gateway = Gateway(f"http://127.0.0.1:{port}", token, log)
    try:
        _wait_ready(gateway, process)
        yield gateway
    finally:
        process.terminate()
        process.wait(15)


def _wait_ready(gateway: Gateway, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"speclane serve exited:\n{gateway.log.read_text()[-2000:]}")
        try:
            if httpx.get(gateway.url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"speclane serve not ready:\n{gateway.log.read_text()[-2000:]}")


@dataclass(frozen=True)
class Counters:
    """vLLM's own speculative-decoding counters, read independently of the gateway's parser."""

    drafts: float
    draft_tokens: float
    accepted: float
    steps: float = 0.0  # engine steps (iterations), prefill's included
    generated: float = 0.0
    requests: float = 0.0

    def __sub__(self, earlier: Counters) -> Counters:
        return Counters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            self.steps - earlier.steps,
            self.generated - earlier.generated,
            self.requests - earlier.requests,
        )

    def decode_tokens_per_step(self) -> float:
        """Tokens per decode step over requests served one at a time with short prompts:
        each request's first token comes from its one prefill step."""
        return (self.generated - self.requests) / (self.steps - self.requests)


def counters(server_url: str) -> Counters:
    """The server's ``vllm:spec_decode_*`` counters, from its ``/metrics``."""
    text = httpx.get(server_url + "/metrics", timeout=10).text
    return Counters(
        sample(text, "vllm:spec_decode_num_drafts_total"),
        sample(text, "vllm:spec_decode_num_draft_tokens_total"),
        sample(text, "vllm:spec_decode_num_accepted_tokens_total"),
        sample(text, "vllm:iteration_tokens_total_count"),
        sample(text, "vllm:generation_tokens_total"),
        sample(text, "vllm:request_success_total"),
    )


def sample(metrics: str, name: str, **labels: str) -> float:
    """The sum of the Prometheus samples of ``name`` that carry ``labels`` (0 when none)."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in metrics.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match and all(w in (match.group(1) or "") for w in want):
            total += float(match.group(2))
    return total
