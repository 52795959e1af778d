"""Speculation is lossless at temperature 0 on real vLLM: the speculative servers answer the
standard server's text, and speclane's shadow canary, comparing them live, agrees."""

from __future__ import annotations

import time

import httpx
import pytest

from gateway.cli.localvllm.stackfile import StackState
from tests.vllm.serve import sample, speclane_serve

pytestmark = pytest.mark.vllm

PROMPTS = [
    "class Parser:\n    def parse(self, text):\n",
    "import os\nimport sys\n\ndef main(",
    "Tell me a story about a dragon.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    '{"name": "Ada", "age": 36, "languages": [',
    "SELECT name, age FROM users WHERE",
]


def greedy(url: str, model: str, prompt: str) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 64,
    }
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


def test_speculative_servers_answer_the_standard_text(stack: StackState):
    urls = {s.name: s.url for s in stack.servers}
    for prompt in PROMPTS:
        answers = {name: greedy(url, stack.model, prompt) for name, url in urls.items()}
        assert answers["ngram"] == answers["standard"], prompt
        assert answers["draft"] == answers["standard"], prompt


SHADOW_POLICY = """
version: 1
pools:
  standard: {{kind: standard, model: {model}, endpoints: [{standard}]}}
  {spec}: {{kind: speculative, model: {model}, num_speculative_tokens: 4, endpoints: [{url}]}}
ladder: [{spec}, standard]
rules:
  - {{name: measured, start: shadow, shadow_fraction: 1.0, shadow_to: {spec}}}
"""


@pytest.mark.parametrize("spec", ["ngram", "draft"])
def test_the_shadow_canary_agrees(stack: StackState, tmp_path, spec):
    standard, mirror = stack.server("standard"), stack.server(spec)
    assert standard is not None and mirror is not None
    policy = SHADOW_POLICY.format(
        model=stack.model, standard=standard.url, spec=spec, url=mirror.url
    )
    with speclane_serve(tmp_path, policy) as gateway:
        for prompt in PROMPTS:
            assert greedy(gateway.url, stack.model, prompt)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            metrics = gateway.metrics()
            compared = sum(
                sample(metrics, "speclane_shadow_mirrors_total", pool="canary", result=r)
                for r in ("match", "mismatch")
            )
            if compared >= len(PROMPTS):
                break
            time.sleep(0.2)
    assert sample(metrics, "speclane_shadow_mirrors_total", pool="canary", result="match") == len(
        PROMPTS
    )
    assert sample(metrics, "speclane_shadow_mirrors_total", pool="canary", result="mismatch") == 0
