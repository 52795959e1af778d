"""Two endpoints of one pool, each a real vLLM with its prefix cache on (vLLM's default): a
10-turn conversation through speclane, over chat and over Anthropic's Messages, is served on
one endpoint throughout and finds its history cached from its second turn on. On chat,
vLLM's own answer says so (``usage.prompt_tokens_details.cached_tokens``, which the stack's
``--enable-prompt-tokens-details`` turns on); on Messages, whose answer vLLM 0.32 leaves
without it, the serving engine's ``vllm:prefix_cache_hits_total`` tells. Which endpoint
served a turn is read from the engines' own ``vllm:request_success_total``, not from
speclane. The guardrail is pinned: what is tested is the endpoint choice inside a pool."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from gateway.cli.localvllm.stackfile import StackState
from tests.vllm.serve import PINNED, sample, speclane_serve
from tests.vllm.test_vllm_apis import claude

pytestmark = pytest.mark.vllm

TURNS = 10
# several of vLLM's CPU KV blocks (128 tokens) long, and ten turns well within the stack's
# 2,048-token max_model_len
SYSTEM = "You review Python code. Point out bugs first, then style, one line each. " * 24
OPENING = "def parse(self, text):\n    return text.split()\n"


def pair_policy(stack: StackState) -> tuple[str, list[str]]:
    """A pool of the stack's two speculative servers (k=4 both) above its standard one."""
    ngram, draft, standard = (stack.server(n) for n in ("ngram", "draft", "standard"))
    assert ngram is not None and draft is not None and standard is not None
    assert ngram.k == draft.k
    pair = [ngram.url, draft.url]
    policy = (
        "version: 1\n"
        "pools:\n"
        f"  pair: {{kind: speculative, model: {stack.model}, num_speculative_tokens: "
        f"{ngram.k}, endpoints: [{', '.join(pair)}]}}\n"
        f"  standard: {{kind: standard, model: {stack.model}, endpoints: [{standard.url}]}}\n"
        "ladder: [pair, standard]\n"
        "rules:\n"
        "  - {name: default, start: pair}\n"
    )
    return policy + PINNED, pair


def counts(urls: list[str]) -> dict[str, tuple[float, float]]:
    """Each engine's finished requests and prefix-cache hits (tokens), from its /metrics."""
    out = {}
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10).text
        out[url] = (
            sample(text, "vllm:request_success_total"),
            sample(text, "vllm:prefix_cache_hits_total"),
        )
    return out


def one_more(urls: list[str], before: dict[str, tuple[float, float]]) -> tuple[str, float]:
    """The engine that finished the one request sent since ``before``, and the prefix-cache
    hits it counted meanwhile (its counters move as the answer ends: waited for briefly)."""
    deadline = time.monotonic() + 10
    while True:
        now = counts(urls)
        grew = [u for u in urls if now[u][0] > before[u][0]]
        done = sum(now[u][0] - before[u][0] for u in urls)
        if done >= 1 or time.monotonic() > deadline:
            assert len(grew) == 1 and done == 1, (before, now)
            (url,) = grew
            return url, now[url][1] - before[url][1]
        time.sleep(0.05)


def test_a_chat_conversation_keeps_its_endpoint_and_its_cache(stack: StackState, tmp_path):
    policy, pair = pair_policy(stack)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": OPENING},
    ]
    served, cached = [], []
    with speclane_serve(tmp_path, policy) as gateway:
        client = gateway.client()
        for turn in range(1, TURNS + 1):
            before = counts(pair)
            raw = client.chat.completions.with_raw_response.create(
                model=stack.model, messages=history, temperature=0, max_tokens=12
            )
            answer = raw.parse()
            assert raw.headers["x-speclane-pool"] == "pair"
            served.append(one_more(pair, before)[0])
            details = answer.usage.prompt_tokens_details if answer.usage else None
            cached.append((details.cached_tokens or 0) if details else 0)
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
            history.append({"role": "user", "content": f"And what does case {turn} return?"})
    assert len(set(served)) == 1, served
    assert all(c > 0 for c in cached[1:]), cached


def test_a_messages_conversation_keeps_its_endpoint_and_its_cache(stack: StackState, tmp_path):
    policy, pair = pair_policy(stack)
    messages: list[dict[str, Any]] = [{"role": "user", "content": OPENING}]
    served, hits = [], []
    with speclane_serve(tmp_path, policy) as gateway, claude(gateway.url) as client:
        for turn in range(1, TURNS + 1):
            before = counts(pair)
            raw = client.messages.with_raw_response.create(
                model=stack.model,
                system=SYSTEM,
                messages=messages,
                max_tokens=12,
                extra_body={"temperature": 0.0},
            )
            answer = raw.parse()
            assert raw.headers["x-speclane-pool"] == "pair"
            where, hit = one_more(pair, before)
            served.append(where)
            hits.append(hit)
            said = "".join(b.text for b in answer.content if b.type == "text") or "(nothing)"
            messages.append({"role": "assistant", "content": said})
            messages.append({"role": "user", "content": f"And what does case {turn} return?"})
    assert len(set(served)) == 1, served
    assert all(h > 0 for h in hits[1:]), hits
