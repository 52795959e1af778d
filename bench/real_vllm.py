"""speclane against real vLLM (the ``speclane local-vllm`` stack): what each acceptance
signal reads next to vLLM's own counters, and whether greedy answers agree across pools.

    .venv/bin/speclane local-vllm up
    .venv/bin/python bench/real_vllm.py [--run-dir DIR] [--requests 24]

For each speculative server (ngram k=4, draft model k=4) the same greedy requests go through
a real ``speclane serve`` (pinned to that server by the ``x-speclane-endpoint`` header),
streamed with usage, one at a time, while nothing else talks to the server. vLLM's
``vllm:spec_decode_*`` counters are read before and after. The table shows the draft
acceptance rate those counters imply, what speclane's live stats recorded (the
``per_request`` signal), and what counting chunks as acceptance reads from the same streams
((T - C) accepted of k (C - 1) drafted, T tokens in C content chunks). Tokens per decode
step are shown three ways: what the engine's own step count implies (generated tokens less
each request's prefill token, over ``vllm:iteration_tokens_total``'s count less one prefill
step per request), what speclane recorded, and what the chunks imply. Then each prompt is
asked of all three servers directly at temperature 0 and the answers are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from procs import Supervisor, free_port

from gateway.cli.localvllm.install import default_cache
from gateway.cli.localvllm.stackfile import StackState, policy_text

K = 4
PROMPTS = [
    "class Parser:\n    def parse(self, text):\n",
    "import os\nimport sys\n\ndef main(",
    "Repeat exactly:\nclass Point:\n    x = 1\nclass Point:\n    x = 1\n",
    "Tell me a story about a dragon.",
    '{"name": "Ada", "age": 36, "languages": [',
    "SELECT name, age FROM users WHERE",
]
COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")
ENGINE = {  # engine steps (prefill's included), tokens generated, requests finished
    "steps": "vllm:iteration_tokens_total_count",
    "generated": "vllm:generation_tokens_total",
    "requests": "vllm:request_success_total",
}
# the endpoint header pins each request to its server: the guardrail must not move it
PINNED = "guardrail: {mode: threshold, min_acceptance: 0, recover_above: 0}\n"


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for name in COUNTERS:
        match = re.search(rf"^vllm:spec_decode_num_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M)
        out[name] = float(match.group(1)) if match else 0.0
    for key, name in ENGINE.items():
        found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        out[key] = sum(float(v) for v in found)
    return out


def stream(client: httpx.Client, url: str, body: dict[str, Any], pool: str) -> dict[str, Any]:
    """One streamed answer: content chunks, completion tokens, per-request figures."""
    chunks, usage, spec = 0, {}, {}
    headers = {"x-speclane-endpoint": pool}
    with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if any((c.get("delta") or {}).get("content") for c in event["choices"]):
                chunks += 1
            if event.get("usage"):
                usage = event["usage"]
                spec = (event.get("metrics") or {}).get("speculative_decoding") or {}
    return {"chunks": chunks, "tokens": usage["completion_tokens"], "spec": spec}


def measure(gateway: str, server_url: str, pool: str, model: str, n: int) -> dict[str, Any]:
    before = counters(server_url)
    answers = []
    with httpx.Client(timeout=300) as client:
        for i in range(n):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "temperature": 0,
                "max_tokens": (64, 128, 200)[i % 3],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            answers.append(stream(client, gateway, body, pool))
    after = counters(server_url)
    delta = {k: after[k] - before[k] for k in (*COUNTERS, *ENGINE)}
    steps = sum(a["chunks"] - 1 for a in answers)
    return {
        "counters": delta["accepted_tokens"] / delta["draft_tokens"],
        "mean_length": 1 + delta["accepted_tokens"] / delta["drafts"],
        "per_request": sum(a["spec"].get("num_accepted_draft_tokens", 0) for a in answers)
        / sum(a["spec"].get("num_draft_tokens", 0) for a in answers),
        "chunks": sum(a["tokens"] - a["chunks"] for a in answers) / (K * steps),
        "tokens_per_step": sum(a["tokens"] - 1 for a in answers) / steps,
        "engine_per_step": (delta["generated"] - delta["requests"])
        / (delta["steps"] - delta["requests"]),
        "drafted": delta["draft_tokens"],
        "tokens": sum(a["tokens"] for a in answers),
    }


def window(gateway: str, token: str, rule: str, pool: str) -> tuple[float, float]:
    """(draft acceptance, tokens per decode step) of ``rule``'s slice on ``pool``."""
    stats = httpx.get(
        gateway + "/admin/stats", headers={"authorization": f"Bearer {token}"}, timeout=10
    ).json()["slices"]
    (found,) = [s["pools"][pool] for s in stats.values() if s["rule"] == rule]
    return float(found["acceptance"]), float(found["tokens_per_step"])


def greedy_agreement(stack: StackState) -> tuple[int, int]:
    equal = 0
    with httpx.Client(timeout=300) as client:
        for prompt in PROMPTS:
            texts = set()
            for server in stack.servers:
                body = {
                    "model": stack.model,
                    "messages": [{"role": "user", "content": prompt}],
                    "temperature": 0,
                    "max_tokens": 128,
                }
                answer = client.post(server.url + "/v1/chat/completions", json=body).json()
                texts.add(answer["choices"][0]["message"]["content"])
            equal += len(texts) == 1
    return equal, len(PROMPTS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=default_cache() / "local-vllm")
    parser.add_argument("--requests", type=int, default=24)
    args = parser.parse_args()
    stack = StackState.load(args.run_dir)
    if stack is None:
        sys.stderr.write(f"no stack in {args.run_dir}: run `speclane local-vllm up` first\n")
        return 2
    token, port = secrets.token_urlsafe(12), free_port()
    with tempfile.TemporaryDirectory() as tmp, Supervisor(Path(tmp)) as procs:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(policy_text(stack) + PINNED)
        env = {**os.environ, "SPECLANE_ADMIN_TOKEN": token}
        argv = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy)]
        gateway = procs.start("gateway", [*argv, "--port", str(port)], env)
        url = f"http://127.0.0.1:{port}"
        procs.wait_ready(gateway, url + "/readyz")
        print(
            "| server | requests | tokens | drafted | counters | speclane (per_request) "
            "| sum of per-request figures | chunk estimate | mean acceptance length (counters) "
            "| tokens per decode step: engine steps | speclane (per_request) | chunks |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for server in (s for s in stack.servers if s.k):
            got = measure(url, server.url, server.name, stack.model, args.requests)
            seen, per_step = window(url, token, server.name, server.name)
            print(
                f"| {server.name} | {args.requests} | {got['tokens']} | {got['drafted']:.0f} "
                f"| {got['counters']:.4f} | {seen:.4f} | {got['per_request']:.4f} "
                f"| {got['chunks']:.4f} | {got['mean_length']:.2f} "
                f"| {got['engine_per_step']:.2f} | {per_step:.2f} "
                f"| {got['tokens_per_step']:.2f} |"
            )
    equal, total = greedy_agreement(stack)
    print(f"\ngreedy answers equal on all of {[s.name for s in stack.servers]}: {equal}/{total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
