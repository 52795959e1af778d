"""Two endpoints of one pool, each a real vLLM with its prefix cache on: once one endpoint
carries two long streams (past the pool's load bound), the next new conversation lands on
the other, while a conversation that endpoint holds stays there, because a few steps beside
two other sequences cost it less than prefilling its whole history again elsewhere (the
pool's step times, learned from the conversation's earlier turns, say so). Which endpoint
served a request is read from the engines' own ``vllm:request_success_total``, how it was
placed from speclane's ``speclane_placements_total``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import openai
import orjson
import pytest

from backends.placement import Affinity, place
from gateway import schema
from gateway.apis import named
from gateway.cli.localvllm.stackfile import StackState
from gateway.prompt.prints import prints
from gateway.prompt.render import segments
from tests.vllm.serve import Gateway, sample, speclane_serve
from tests.vllm.test_vllm_prefix import counts, one_more, pair_policy

pytestmark = pytest.mark.vllm

# over a thousand of the tiny tokenizer's tokens: re-prefilling it costs far more than a
# few steps beside two other sequences, within the stack's 2,048-token max_model_len
SYSTEM = "You review Python code. Point out bugs first, then style, one line each. " * 50
OPENING = "def parse(self, text):\n    return text.split()\n"


def ask(gateway: Gateway, model: str, history: list[dict[str, Any]], tokens: int) -> str:
    answer = gateway.client().chat.completions.create(
        model=model, messages=history, temperature=0, max_tokens=tokens
    )
    return answer.choices[0].message.content or "(nothing)"


def placed(gateway: Gateway, how: str) -> float:
    return sample(gateway.metrics(), "speclane_placements_total", pool="pair", how=how)


@dataclass
class Idle:
    url: str
    outstanding: int = 0
    prefilling: int = 0


def unloaded_choice(history: list[dict[str, Any]], urls: list[str]) -> str:
    """Where a new conversation opening with ``history`` goes on an idle pool: its
    opening's rendezvous choice, the same in every gateway."""
    body = {"model": "tiny", "messages": history}
    parsed, _ = schema.parse(orjson.dumps(body), named("/v1/chat/completions").model)
    opening = prints(segments(parsed)).opening
    return place([Idle(u) for u in urls], Affinity(opening), lambda _: 1.0)[0][0].url


def grown(urls: list[str], before: dict[str, tuple[float, float]], until: Any) -> dict[str, Any]:
    """Each engine's finished requests and cache hits since ``before``, once ``until`` says
    so of them (within 10 s: the counters move as answers end)."""
    deadline = time.monotonic() + 10
    while True:
        now = counts(urls)
        delta = {u: (now[u][0] - before[u][0], now[u][1] - before[u][1]) for u in urls}
        if until(delta) or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)


@pytest.mark.xfail(
    reason="after other tests on the same engines, the held conversation is sometimes moved "
    "(no step-time price learned yet: the plain load bound decides) or the new one kept",
    strict=False,
)
def test_a_loaded_endpoint_takes_no_new_conversation_but_keeps_its_own(stack: StackState, tmp_path):
    policy, pair = pair_policy(stack)
    model = stack.model
    held: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": OPENING},
    ]
    streams: list[openai.Stream[Any]] = []
    with speclane_serve(tmp_path, policy) as gateway:
        served = []
        for turn in range(1, 7):  # the pool's step times and the turns' length, learned
            before = counts(pair)
            said = ask(gateway, model, held, 12)  # steps enough to be timed
            served.append(one_more(pair, before)[0])
            held += [
                {"role": "assistant", "content": said},
                {"role": "user", "content": f"And case {turn}?"},
            ]
        (home,) = set(served)
        (other,) = [url for url in pair if url != home]
        # two other conversations that the same endpoint serves, each then sent a long stream
        loaders: list[list[dict[str, Any]]] = []
        for n in range(16):
            if len(loaders) == 2:
                break
            history = [{"role": "user", "content": f"Write a story about lighthouse {n}."}]
            before = counts(pair)
            said = ask(gateway, model, history, 2)
            if one_more(pair, before)[0] == home:
                loaders.append([*history, {"role": "assistant", "content": said}])
        assert len(loaders) == 2, "no two conversations landed on one endpoint in 16"
        # a new conversation that an idle pool would send to that same endpoint
        fresh = next(
            h
            for n in range(64)
            if unloaded_choice(h := [{"role": "user", "content": f"A new question, {n}."}], pair)
            == home
        )
        client = gateway.client()
        for history in loaders:
            # 1,500 tokens with their 20 likeliest alternatives each: over 2 MB of events,
            # more than the sockets hold, so the relay waits on this client, who reads one
            # event: the gateway counts both in flight until they are closed (the engine may
            # be done sooner)
            stream = client.chat.completions.create(
                model=model,
                messages=[*history, {"role": "user", "content": "Go on, at length."}],
                max_tokens=1_500,
                stream=True,
                logprobs=True,
                top_logprobs=20,
                extra_body={"ignore_eos": True},
            )
            next(iter(stream))  # under way
            streams.append(stream)
        try:
            before, loaded = counts(pair), placed(gateway, "cache_loaded")
            # a new conversation: the endpoint its opening picks is past the bound, so the
            # other (were the two streams not counted, it would go where its opening picks)
            ask(gateway, model, fresh, 4)
            delta = grown(pair, before, lambda d: d[other][0] >= 1)
            assert delta[other][0] == 1, delta
            before = counts(pair)
            ask(gateway, model, held, 4)  # the held one: stays, its history cached
            delta = grown(pair, before, lambda d: d[home][1] > 0 or d[other][0] > 0)
            assert delta[other][0] == 0 and delta[home][1] > 0, delta
            assert placed(gateway, "cache_loaded") == loaded + 1
        finally:
            for stream in streams:
                stream.close()
