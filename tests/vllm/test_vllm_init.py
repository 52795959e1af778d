"""``speclane init`` against real vLLM 0.32 servers: the ngram and draft-model servers
(k=4, started with ``--per-request-spec-decode-metrics``) are recognised as speculative vLLM
with their k and their per-request metrics, the standard server as standard, and the policy
written lints clean and serves a request under the rule its header names."""

from __future__ import annotations

import pytest
import yaml

from gateway.cli.localvllm.stackfile import StackState
from policies.compiled import load_policy
from tests.vllm.conftest import speclane
from tests.vllm.serve import speclane_serve

pytestmark = pytest.mark.vllm


def test_init_reads_real_vllm_and_its_policy_serves(stack: StackState, tmp_path):
    ngram, draft, standard = (stack.server(name) for name in ("ngram", "draft", "standard"))
    assert ngram is not None and draft is not None and standard is not None
    out = tmp_path / "policy.yaml"
    argv = ["init", "--spec", ngram.url, "--spec", draft.url, "--standard", standard.url]
    done = speclane(*argv, "--out", out, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{ngram.url} (spec): vllm, speculative, k=4" in done.stdout
    assert f"{standard.url} (standard): vllm, standard" in done.stdout
    assert "check:" not in done.stdout  # both speculative servers report per request
    policy = load_policy(out.read_text())
    assert policy.pools["spec"].endpoints == [ngram.url, draft.url]
    assert policy.pools["spec"].num_speculative_tokens == 4
    assert yaml.safe_load(out.read_text())["pools"]["spec"]["model"] == stack.model
    with speclane_serve(tmp_path, out.read_text()) as gateway:
        client = gateway.client(**{"x-speclane-endpoint": "code"})
        answer = client.chat.completions.with_raw_response.create(
            model=stack.model,
            messages=[{"role": "user", "content": "def add(a, b):"}],
            max_tokens=8,
            temperature=0,
        )
    assert answer.headers["x-speclane-rule"] == "code"
    assert answer.headers["x-speclane-pool"] in ("spec", "standard")  # the guardrail may explore
    assert answer.parse().choices[0].message.content
