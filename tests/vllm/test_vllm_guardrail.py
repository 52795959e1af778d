"""The guardrail on real speculation. A slice the draft model cannot predict (sampled at
temperature 1: the 1-layer draft's tokens are almost never the target's) falls back to the
standard pool under the operator's fixed acceptance threshold; a slice whose answers repeat
what is already in the context (greedy: the tiny model settles into a repeating line that
ngram predicts) stays on ngram speculation under the default, economic guardrail."""

from __future__ import annotations

import time

import pytest

from gateway.cli.localvllm.stackfile import StackState
from tests.vllm.serve import Gateway, speclane_serve

pytestmark = pytest.mark.vllm

POLICY = """
version: 1
pools:
  standard: {{kind: standard, model: {model}, endpoints: [{standard}]}}
  {spec}: {{kind: speculative, model: {model}, num_speculative_tokens: 4, endpoints: [{url}]}}
ladder: [{spec}, standard]
guardrail: {{{guardrail}}}
rules:
  - {{name: slice, start: {spec}}}
"""
TOPICS = ["a dragon", "the sea", "a city at night", "winter", "a lost key", "two robots"]


def served_pools(gateway: Gateway, model: str, prompts: list[str], temperature: float):
    client = gateway.client()
    pools = []
    for seed, prompt in enumerate(prompts):
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            temperature=temperature,
            seed=seed,
            max_tokens=48,
        )
        pools.append(raw.headers["x-speclane-pool"])
    return pools


def policy(stack: StackState, spec: str, guardrail: str) -> str:
    urls = {s.name: s.url for s in stack.servers}
    return POLICY.format(
        model=stack.model, standard=urls["standard"], spec=spec, url=urls[spec], guardrail=guardrail
    )


def test_a_slice_the_draft_cannot_predict_falls_back(stack: StackState, tmp_path):
    text = policy(stack, "draft", "mode: threshold, min_samples: 6, cooldown_s: 3600")
    with speclane_serve(tmp_path, text) as gateway:
        prompts = [f"Write a poem about {topic}." for topic in TOPICS * 2]
        pools = served_pools(gateway, stack.model, prompts, temperature=1.0)
        events = gateway.admin("/admin/guardrail")["events"]  # type: ignore[index]
    assert pools[0] == "draft" and pools[-1] == "standard", pools
    assert [(e["from"]["phase"], e["to"]["phase"]) for e in events] == [("on", "fallen_back")]


def test_prompts_that_copy_from_the_context_stay(stack: StackState, tmp_path):
    with speclane_serve(tmp_path, policy(stack, "ngram", "min_samples: 6")) as gateway:
        prompts = [
            f"Repeat exactly:\nclass Point{i}:\n    x = {i}\nclass Point{i}:\n    x = {i}\n"
            for i in range(12)
        ]
        pools = served_pools(gateway, stack.model, prompts, temperature=0.0)
        events = gateway.admin("/admin/guardrail")["events"]  # type: ignore[index]
    assert pools == ["ngram"] * 12 and events == []


def test_one_client_with_one_key_recovers(stack: StackState, tmp_path):
    """One API key, no ``user``: after the cooldown a fraction of the slice's requests probe
    the speculative pool, so when acceptance returns (greedy requests after sampled ones, in
    one slice: no temperature bands) the slice comes back within a bounded number of
    requests, whoever the client is."""
    guardrail = (
        "mode: threshold, min_acceptance: 0.08, recover_above: 0.1, min_samples: 4, "
        "cooldown_s: 2, probe_fraction: 0.25"
    )
    text = policy(stack, "draft", guardrail) + "slices: {temperature: []}\n"
    with speclane_serve(tmp_path, text) as gateway:
        sampled = [f"Write a poem about {topic}." for topic in TOPICS]
        assert served_pools(gateway, stack.model, sampled, temperature=1.0)[-1] == "standard"
        time.sleep(2.5)  # the cooldown
        greedy = [f"def parse_{i}(self, text):\n" for i in range(80)]
        pools = served_pools(gateway, stack.model, greedy, temperature=0.0)
        events = gateway.admin("/admin/guardrail")["events"]  # type: ignore[index]
    phases = [e["to"]["phase"] for e in events]
    assert phases[0] == "fallen_back" and phases[-1] == "on", phases
    assert pools[-1] == "draft" and "draft" in pools[:60], pools
