"""A non-streaming answer through speclane equals the pool's own answer, field by field, its
nulls included, up to ``id`` and ``created``: passed through where the pool reports
per-request metrics (or is standard), assembled from the stream otherwise; requests a stream
cannot carry exactly always pass through, and so do Messages and Responses answers. Checked
against the simulator's own whole answers (which ``tests/backends/sim`` checks against real
vLLM's) and against the openai SDK's stream accumulator."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.config import Mode, SimConfig
from tests.gateways import sim_policy, sim_stack

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"


ASSEMBLE = sim_policy(spec="passthrough_non_streaming: false")
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write python to add two numbers."}],
    "temperature": 0,
    "max_tokens": 40,
}
COMPLETION = {"model": MODEL, "prompt": "def add(a, b):", "temperature": 0, "max_tokens": 30}
CHAT_CASES = [
    {},
    {"logprobs": True, "top_logprobs": 3},
    {"return_token_ids": True},
    {"max_tokens": 7, "stop": ["\n\n"]},
    {"response_format": {"type": "json_object"}, "max_tokens": 25},
]
COMPLETION_CASES = [{}, {"logprobs": 2}, {"return_token_ids": True}, {"max_tokens": 5}]


def same(answer: Any) -> Any:
    """An answer without ``id``, ``created`` and null fields (at every depth)."""
    if isinstance(answer, dict):
        return {
            k: same(v) for k, v in answer.items() if v is not None and k not in ("id", "created")
        }
    if isinstance(answer, list):
        return [same(v) for v in answer]
    return answer


def quiet_spec() -> SimConfig:
    """A speculative pool that reports nothing per request: its answers are assembled."""
    return SimConfig(time_scale=0.01, per_request_metrics=False)


async def both(stack: Any, path: str, body: dict[str, Any]) -> tuple[httpx.Response, Any]:
    async with httpx.AsyncClient() as c:
        via = await c.post(stack.url + path, json=body)
        own = (await c.post(stack.spec + path, json=body)).json()
    return via, own


async def streamed(stack: Any) -> int:
    """How many requests the speculative simulator answered as a stream."""
    async with httpx.AsyncClient() as c:
        state = (await c.get(stack.spec + "/sim/state")).json()
    return int(state["outcomes"]["streamed"])


def fields(answer: Any, path: str = "") -> list[str]:
    """Every field's path in order, nulls included (a list's first item stands for all)."""
    if isinstance(answer, dict):
        return [f for k, v in answer.items() for f in [f"{path}.{k}", *fields(v, f"{path}.{k}")]]
    if isinstance(answer, list):
        return [f for v in answer[:1] for f in fields(v, path + "[]")]
    return []


@pytest.mark.parametrize("extra", CHAT_CASES)
async def test_assembled_chat_answers_equal_the_pools_own(tmp_path, extra):
    async with sim_stack(tmp_path, ASSEMBLE, quiet_spec()) as stack:
        via, own = await both(stack, "/v1/chat/completions", CHAT | extra)
        assert await streamed(stack) == 1  # assembled from a stream
    assert via.status_code == 200 and via.headers["x-speclane-pool"] == "spec"
    answer = via.json()
    assert fields(answer) == fields(own)  # the nulls a stream leaves out too, in their order
    assert answer["service_tier"] is None and answer["choices"][0]["message"]["refusal"] is None
    assert same(answer) == same(own)
    parsed, reference = ChatCompletion.model_validate(answer), ChatCompletion.model_validate(own)
    skip = {"id", "created"}
    assert parsed.model_dump(exclude=skip, exclude_none=True) == reference.model_dump(
        exclude=skip, exclude_none=True
    )


@pytest.mark.parametrize("extra", COMPLETION_CASES)
async def test_assembled_completions_equal_the_pools_own(tmp_path, extra):
    async with sim_stack(tmp_path, ASSEMBLE, quiet_spec()) as stack:
        via, own = await both(stack, "/v1/completions", COMPLETION | extra)
        assert await streamed(stack) == 1
    assert via.status_code == 200
    assert fields(via.json()) == fields(own)
    assert same(via.json()) == same(own)


MESSAGES = {
    "model": MODEL,
    "max_tokens": 30,
    "temperature": 0,
    "messages": [{"role": "user", "content": "Write python to add two numbers."}],
}
RESPONSES = {"model": MODEL, "input": "Write python to add two numbers.", "temperature": 0}


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)]
)
async def test_messages_and_responses_answers_are_the_speculative_pools_own(tmp_path, path, body):
    """Non-streaming Messages and Responses requests go upstream whole on every pool: the
    answer is the pool's own, every field of it."""
    async with sim_stack(tmp_path, ASSEMBLE, quiet_spec()) as stack:
        via, own = await both(stack, path, body)
        assert await streamed(stack) == 0
    assert via.status_code == 200 and via.headers["x-speclane-pool"] == "spec"
    assert fields(via.json()) == fields(own)
    skip = ("id", "created_at", "output")  # ids, and the output items' own ids
    assert {k: v for k, v in via.json().items() if k not in skip} == {
        k: v for k, v in own.items() if k not in skip
    }


async def test_the_sdk_accumulates_the_stream_into_the_assembled_answer(tmp_path):
    # the accumulator refuses answers cut by max_tokens: let this one end by itself
    body = CHAT | {"logprobs": True, "top_logprobs": 2, "max_tokens": 1000}
    async with sim_stack(tmp_path, ASSEMBLE, quiet_spec()) as stack:
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        async for chunk in await client.chat.completions.create(**body, stream=True):
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk.model_dump()))
        whole = await client.chat.completions.create(**body)
        await client.close()
    accumulated = state.get_final_completion().choices[0]
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"
    assert accumulated.message.content == choice.message.content
    assert accumulated.finish_reason == choice.finish_reason
    assert accumulated.logprobs is not None and choice.logprobs is not None
    assert accumulated.logprobs.content == choice.logprobs.content


@pytest.mark.parametrize(
    "extra",
    [
        {"prompt_logprobs": 2},
        {"n": 1, "echo": True},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
        {"stream_options": {"include_usage": True}},
    ],
)
async def test_what_a_stream_cannot_carry_passes_through(tmp_path, extra):
    async with sim_stack(tmp_path, ASSEMBLE, quiet_spec()) as stack:
        via, own = await both(stack, "/v1/chat/completions", CHAT | extra)
        assert await streamed(stack) == 0  # the pool's own bytes
    assert via.status_code == (400 if "stream_options" in extra else 200)
    assert same(via.json()) == same(own)
    if "prompt_logprobs" in extra:
        assert via.json()["prompt_logprobs"][1]  # vLLM 400s it in a stream


async def test_standard_pools_and_reporting_speculative_pools_pass_through(tmp_path):
    spec = SimConfig(time_scale=0.01, timing_metrics=True)
    async with sim_stack(tmp_path, sim_policy(), spec) as stack, httpx.AsyncClient() as c:
        url = stack.url + "/v1/chat/completions"
        first = (await c.post(url, json=CHAT)).json()
        assert await streamed(stack) == 1  # nothing known of the pool yet: streamed, measured
        before = _tpot_count((await c.get(stack.url + "/metrics")).text)
        second = (await c.post(url, json=CHAT)).json()
        assert await streamed(stack) == 1
        after = _tpot_count((await c.get(stack.url + "/metrics")).text)
        seen = stack.services.reports.known()
    assert seen == {"spec": True}  # its usage chunk carried metrics.speculative_decoding
    assert fields(first) == fields(second) and second["metrics"]["speculative_decoding"]
    # the passed-through answer's engine timings stand in for the gateway's own (the
    # streamed one's time per token is the gateway's, and there is none when a busy
    # machine hands it every chunk in one read)
    assert after == before + 1


def _tpot_count(metrics: str) -> float:
    counts = [
        s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "speclane_tpot_seconds_count" and s.labels["pool"] == "spec"
    ]
    return sum(counts)


async def test_a_standard_pool_passes_through_from_the_first_request(tmp_path):
    text = sim_policy(start="standard")
    async with sim_stack(tmp_path, text, quiet_spec()) as stack, httpx.AsyncClient() as c:
        answer = (await c.post(stack.url + "/v1/chat/completions", json=CHAT)).json()
        assert await streamed(stack) == 0
    assert answer["choices"][0]["message"]["content"]


async def test_a_pool_without_per_request_metrics_stays_assembled(tmp_path):
    async with sim_stack(tmp_path, sim_policy(), quiet_spec()) as stack, httpx.AsyncClient() as c:
        for _ in range(3):
            await c.post(stack.url + "/v1/chat/completions", json=CHAT)
        seen = stack.services.reports.known()
        assert await streamed(stack) == 3
    assert seen == {"spec": False}


async def test_running_usage_reaches_a_streaming_client_that_asked_for_it(tmp_path):
    async with sim_stack(tmp_path, sim_policy(), quiet_spec()) as stack, httpx.AsyncClient() as c:
        asked = {"include_usage": True, "continuous_usage_stats": True}
        body = CHAT | {"stream": True}
        with_usage = await c.post(
            stack.url + "/v1/chat/completions", json=body | {"stream_options": asked}
        )
        without = await c.post(
            stack.url + "/v1/chat/completions",
            json=body | {"stream_options": {"continuous_usage_stats": True}},
        )
    chunks = [orjson.loads(line[6:]) for line in with_usage.text.split("\n\n") if line[6:7] == "{"]
    assert all(c["usage"] is not None for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == counts[-2]  # running, then the total
    assert '"usage"' not in without.text  # vLLM: no usage without include_usage


async def test_the_standard_sim_equals_itself_through_speclane(tmp_path):
    """A standard pool's whole answer, passed through, is byte for byte the pool's own but
    for id and created."""
    standard = SimConfig(mode=Mode.STANDARD, time_scale=0.01)
    text = sim_policy(start="standard")
    async with sim_stack(tmp_path, text, standard) as stack:
        via, own = await both(stack, "/v1/chat/completions", CHAT | {"logprobs": True})
    assert same(via.json()) == same(own)
    assert list(via.json()) == list(own)  # every key, in vLLM's order


async def test_several_choices_pass_through_and_are_not_read_as_chunks(tmp_path):
    body = CHAT | {"n": 2, "temperature": 0.7}
    async with sim_stack(tmp_path, ASSEMBLE, quiet_spec()) as stack, httpx.AsyncClient() as c:
        url = stack.url + "/v1/chat/completions"
        whole = (await c.post(url, json=body)).json()
        assert await streamed(stack) == 0
        stream = await c.post(url, json=body | {"stream": True})
        metrics = (await c.get(stack.url + "/metrics")).text
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    chunks = [orjson.loads(x[6:]) for x in stream.text.split("\n\n") if x[6:7] == "{"]
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}
    signals = {
        s.labels["signal"]
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "speclane_requests_total"
    }
    assert "chunks" not in signals  # two answers' chunks say nothing of one's steps
