"""Anthropic's Messages and OpenAI's Responses through speclane against real vLLM, with the
official clients: the same answers as from the server speclane chose (greedy, so the text
is comparable within one server), streams relayed event by event, count_tokens passed
through, and a stored response continued on the endpoint that stored it.

What is compared is what holds on every call: the text, stop reasons, usage, each event's
type and fields. Ids, creation times and timings differ between calls; chunk boundaries do
too (vLLM merges the deltas of engine steps its API process has not yet sent), so deltas
are compared joined. vLLM 0.32 carries no per-request speculative figures in these answers
(Messages has no ``metrics``; Responses' ``metrics.speculative_decoding`` is null), which
is why speclane measures them by their chunks; that is checked here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.cli.localvllm.stackfile import StackState, policy_text
from tests.vllm.serve import PINNED, counters, sample, speclane_serve

pytestmark = pytest.mark.vllm

ASK = [{"role": "user", "content": "class Parser:\n    def parse(self, text):\n"}]
DROP = {"id", "created_at", "created", "item_id", "time_to_first_token_ms"}
DROP |= {"generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}
# events the anthropic SDK's stream adds of its own beside those on the wire
SDK_EVENTS = {"text", "input_json", "citation", "thinking", "signature"}


@pytest.fixture(scope="module")
def gateway(stack_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    stack = StackState.load(stack_dir)
    assert stack is not None
    with speclane_serve(tmp_path_factory.mktemp("apis"), policy_text(stack) + PINNED) as running:
        yield running


def url_of(stack: StackState, server: str) -> str:
    running = stack.server(server)
    assert running is not None
    return running.url


def claude(url: str, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url, api_key="sk-test", max_retries=0, default_headers=headers
    )


def codex(url: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url + "/v1", api_key="sk-test", max_retries=0, default_headers=headers
    )


def pruned(value: Any) -> Any:
    """``value`` without nulls, ids, creation times and timings."""
    if isinstance(value, dict):
        return {k: pruned(v) for k, v in value.items() if v is not None and k not in DROP}
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


def joined(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream as comparable across calls: the text its deltas make, the kinds of event in
    their order (a run of deltas counted once), each kind's fields, and the last event."""
    text, kinds, fields = [], [], {}
    for event in events:
        kind = event["type"]
        if kind in SDK_EVENTS:
            continue
        if kind.endswith("delta") and kinds and kinds[-1] == kind:
            pass
        else:
            kinds.append(kind)
        fields[kind] = sorted(event)
        delta = event.get("delta")
        if isinstance(delta, str):
            text.append(delta)
        elif isinstance(delta, dict):
            text.append(delta.get("text") or delta.get("partial_json") or "")
    last = {k: v for k, v in events[-1].items() if k != "sequence_number"}
    return {"text": "".join(text), "kinds": kinds, "fields": fields, "last": pruned(last)}


@pytest.mark.parametrize("server", ["standard", "ngram", "draft"])
def test_messages_are_the_pools_own(stack, gateway, server):
    via, direct = (
        claude(gateway.url, **{"x-speclane-endpoint": server}),
        claude(url_of(stack, server)),
    )
    with via, direct:
        request = {"model": stack.model, "max_tokens": 24, "messages": ASK}
        request["extra_body"] = {"temperature": 0.0}  # anthropic 2.10: no temperature argument
        raw = via.messages.with_raw_response.create(**request)
        assert raw.headers["x-speclane-pool"] == server
        ours = raw.parse().model_dump()
        assert pruned(ours) == pruned(direct.messages.create(**request).model_dump())
        assert ours["content"][0]["text"] and ours["usage"]["output_tokens"] == 24
        with via.messages.stream(**request) as stream:
            streamed = [event.model_dump() for event in stream]
        with direct.messages.stream(**request) as stream:
            assert joined(streamed) == joined([event.model_dump() for event in stream])


@pytest.mark.parametrize("server", ["standard", "ngram", "draft"])
def test_responses_are_the_pools_own(stack, gateway, server):
    via, direct = (
        codex(gateway.url, **{"x-speclane-endpoint": server}),
        codex(url_of(stack, server)),
    )
    with via, direct:
        request = {"model": stack.model, "input": ASK[0]["content"], "max_output_tokens": 24}
        request |= {"temperature": 0.0}
        raw = via.responses.with_raw_response.create(**request)
        assert raw.headers["x-speclane-pool"] == server
        ours = raw.parse().model_dump()
        assert pruned(ours) == pruned(direct.responses.create(**request).model_dump())
        assert ours["output_text"] if "output_text" in ours else ours["output"]
        assert (ours.get("metrics") or {}).get("speculative_decoding") is None
        streamed = [e.model_dump() for e in via.responses.create(**request, stream=True)]
        assert joined(streamed) == joined(
            [e.model_dump() for e in direct.responses.create(**request, stream=True)]
        )
        assert streamed[-1]["type"] in {"response.completed", "response.incomplete"}


def test_count_tokens_passes_through(stack, gateway):
    body = {"model": stack.model, "messages": ASK}
    ours = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body, timeout=30)
    theirs = httpx.post(url_of(stack, "standard") + "/v1/messages/count_tokens", json=body)
    assert ours.status_code == 200 and ours.json() == theirs.json()
    assert ours.json()["input_tokens"] > 0


def test_what_vllm_refuses_on_messages_reaches_the_client_in_anthropics_shape(stack, gateway):
    """vLLM answers a role its Messages model does not know in its OpenAI shape; through
    speclane the anthropic client gets Anthropic's, with vLLM's message."""
    body = {"model": stack.model, "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}
    theirs = httpx.post(url_of(stack, "standard") + "/v1/messages", json=body, timeout=30)
    assert theirs.status_code == 400 and "type" not in theirs.json()
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(gateway.url).messages.create(**body)
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": theirs.json()["error"]["message"]},
    }


def test_a_stored_response_is_continued_where_it_is(stack, tmp_path):
    """One pool of two endpoints (the ngram and draft servers serve the same model): the
    second turn names the first's id and goes to the endpoint that stored it, every time,
    and an id no endpoint stored gets vLLM's own 404."""
    ngram, draft = url_of(stack, "ngram"), url_of(stack, "draft")
    text = (
        "version: 1\npools:\n"
        f"  spec: {{kind: speculative, model: {stack.model}, num_speculative_tokens: 4, "
        f"endpoints: [{ngram}, {draft}]}}\n"
        f"  standard: {{kind: standard, model: {stack.model}, "
        f"endpoints: [{url_of(stack, 'standard')}]}}\n"
        "ladder: [spec, standard]\nrules:\n  - {name: all, start: spec}\n" + PINNED
    )
    with speclane_serve(tmp_path, text) as gateway, codex(gateway.url) as client:
        request = {"model": stack.model, "max_output_tokens": 8, "temperature": 0.0}
        for turn in range(4):
            first = client.responses.create(input=f"def f{turn}(x):\n", store=True, **request)
            raw = client.responses.with_raw_response.create(
                input="and again", previous_response_id=first.id, **request
            )
            assert raw.status_code == 200
            assert raw.headers["x-speclane-reason"].startswith(f"pinned: response {first.id}")
            got = httpx.get(gateway.url + f"/v1/responses/{first.id}", timeout=30)
            assert got.status_code == 200 and got.json()["id"] == first.id
        # vLLM 0.32 has no DELETE for a stored response (the simulator answers the same)
        deleted = httpx.delete(gateway.url + f"/v1/responses/{first.id}", timeout=30)
        assert deleted.status_code == 405 and deleted.json() == {"detail": "Method Not Allowed"}
        kept = httpx.get(gateway.url + f"/v1/responses/{first.id}", timeout=30)
        assert kept.status_code == 200
        with pytest.raises(openai.NotFoundError):
            client.responses.create(
                input="x", previous_response_id="resp_0000000000000000", **request
            )


def test_messages_and_responses_are_measured_by_their_chunks(stack, tmp_path):
    """Streamed through the ngram pool, each API's requests are measured by their chunks
    (one engine step each on a quiet server): the gateway's tokens per step against the
    engine's own step counter."""
    running = stack.server("ngram")
    assert running is not None
    prompts = [
        f"Repeat exactly:\nclass P{i}:\n    x = {i}\nclass P{i}:\n    x = {i}\n" for i in range(3)
    ]
    with speclane_serve(tmp_path, policy_text(stack) + PINNED) as gateway:
        headers = {"x-speclane-endpoint": "ngram"}
        before = counters(running.url)
        with claude(gateway.url, **headers) as client:
            for prompt in prompts:
                with client.messages.stream(
                    model=stack.model,
                    max_tokens=64,
                    messages=[{"role": "user", "content": prompt}],
                    extra_body={"temperature": 0.0},
                ) as stream:
                    stream.until_done()
        with codex(gateway.url, **headers) as client:
            for prompt in prompts:
                for _ in client.responses.create(
                    model=stack.model,
                    input=prompt,
                    max_output_tokens=64,
                    temperature=0.0,
                    stream=True,
                ):
                    pass
        delta = counters(running.url) - before
        window = gateway.window("ngram", "ngram")
        metrics = gateway.metrics()
    assert window["requests"] == window["stepped"] == 2 * len(prompts)
    assert window["tokens_per_step"] == pytest.approx(delta.decode_tokens_per_step(), rel=0.2)
    assert sample(metrics, "speclane_requests_total", pool="ngram", signal="chunks") == 6
