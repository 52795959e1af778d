"""Per-request acceptance as speclane reads it equals what vLLM's own counters say over the
same requests, for ngram and draft-model speculation; so do tokens per decode step against
the engine's own count of its steps (``vllm:iteration_tokens_total``). vLLM counts the
drafts a step accepted past ``max_tokens``, which the answer cuts off, so tokens per step
read per request run high by up to k tokens a request: a few percent at these lengths.

The server is quiet apart from this test's requests (the tier runs its tests one after
another), so the counters' deltas cover exactly these requests. speclane reads vLLM's
``metrics.speculative_decoding`` (the ``per_request`` signal) from the usage chunk it asks
for, whether or not the client asked for usage, streamed or not.
"""

from __future__ import annotations

import pytest

from gateway.cli.localvllm.stackfile import StackState, policy_text
from tests.vllm.serve import PINNED, counters, sample, speclane_serve

pytestmark = pytest.mark.vllm

PROMPTS = [
    "class Parser:\n    def parse(self, text):\n",
    "import os\nimport sys\n\ndef main(",
    "Repeat after me: the cat sat on the mat. The cat sat on the mat. The cat",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(",
]


@pytest.mark.parametrize("server", ["ngram", "draft"])
def test_per_request_acceptance_equals_the_counters(stack: StackState, tmp_path, server):
    running = stack.server(server)
    assert running is not None
    with speclane_serve(tmp_path, policy_text(stack) + PINNED) as gateway:
        client = gateway.client(**{"x-speclane-endpoint": server})
        before = counters(running.url)
        for i, prompt in enumerate(PROMPTS * 2):
            request = {
                "model": stack.model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": 160 + 8 * i,
            }
            if i % 2:
                for _ in client.chat.completions.create(**request, stream=True):
                    pass
            else:
                client.chat.completions.create(**request)
        delta = counters(running.url) - before
        window = gateway.window(server, server)
        metrics = gateway.metrics()
    assert delta.draft_tokens > 0
    assert window["requests"] == window["measured"] == len(PROMPTS) * 2
    assert window["acceptance"] == pytest.approx(delta.accepted / delta.draft_tokens, abs=1e-9)
    # tokens per decode step (what sets the speed) against the engine's own step count
    assert window["tokens_per_step"] == pytest.approx(delta.decode_tokens_per_step(), rel=0.05)
    assert sample(metrics, "speclane_requests_total", pool=server, signal="per_request") == 8
