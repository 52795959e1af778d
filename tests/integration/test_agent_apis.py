"""Anthropic's Messages and OpenAI's Responses through speclane, with the official clients
(``anthropic``, ``openai``) against the simulator: created and streamed answers, a tool use
round trip, structured output, count_tokens, Anthropic-shaped errors, ``x-api-key``; the
streams speclane relays are the pool's own, event by event; and they are measured as chat
is, by the chunk signal on a speculative pool (their answers carry no per-request
metrics)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import httpx
import openai
import pytest

from backends.errors import Unavailable
from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from backends.sim.workload import Workload
from gateway.apis.responses import API as RESPONSES_API
from gateway.demo.agent import Conversation
from gateway.demo.driver import send_messages
from gateway.demo.workload import DemoRequest
from gateway.identity import key_hash
from policies.model import ANONYMOUS
from tests.gateways import fake_stack, sim_policy, sim_stack

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
ASK = [{"role": "user", "content": "Write python to add two numbers."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
FUNCTION = {
    "type": "function",
    "name": WEATHER["name"],
    "description": WEATHER["description"],
    "parameters": WEATHER["input_schema"],
}
PERSON = {
    "type": "json_schema",
    "name": "person",
    "schema": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
}


def sim() -> SimConfig:
    return SimConfig(time_scale=0.01)


@asynccontextmanager
async def claude(url: str, key: str = "unused") -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0) as client:
        yield client


@asynccontextmanager
async def codex(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


async def test_messages_created_and_streamed(tmp_path):
    async with sim_stack(tmp_path, sim_policy(), sim()) as stack, claude(stack.url) as client:
        raw = await client.messages.with_raw_response.create(
            model=MODEL, max_tokens=40, messages=ASK, extra_body={"temperature": 0}
        )
        assert raw.headers["x-speclane-pool"] == "spec"
        message = await raw.parse()
        assert message.role == "assistant" and message.content[0].type == "text"
        assert message.content[0].text and message.usage.output_tokens > 0
        async with client.messages.stream(model=MODEL, max_tokens=40, messages=ASK) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
        assert text and final.content[0].text == text
        assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
        assert final.stop_reason in ("end_turn", "max_tokens")


async def test_a_tool_use_round_trip(tmp_path):
    async with sim_stack(tmp_path, sim_policy(), sim()) as stack, claude(stack.url) as client:
        turns: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
        asked = await client.messages.create(
            model=MODEL,
            max_tokens=400,
            messages=turns,
            tools=[WEATHER],
            tool_choice={"type": "any"},
        )
        (use,) = [block for block in asked.content if block.type == "tool_use"]
        assert asked.stop_reason == "tool_use" and use.name == "get_weather"
        assert set(use.input) == {"city"}
        turns += [
            {"role": "assistant", "content": [block.model_dump() for block in asked.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ]
        async with client.messages.stream(
            model=MODEL, max_tokens=60, messages=turns, tools=[WEATHER]
        ) as stream:
            answer = await stream.get_final_message()
        assert answer.content[0].type == "text" and answer.content[0].text


async def test_count_tokens_directly_and_through_the_gateway(tmp_path):
    async with (
        sim_stack(tmp_path, sim_policy(), sim()) as stack,
        claude(stack.spec) as client,
        claude(stack.url) as through,
    ):
        counted = await client.messages.count_tokens(model=MODEL, messages=ASK)
        answer = await client.messages.create(model=MODEL, max_tokens=5, messages=ASK)
        assert counted.input_tokens == answer.usage.input_tokens > 0
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.count_tokens(model="nope", messages=ASK)
        relayed = await through.messages.count_tokens(model=MODEL, messages=ASK)
        assert relayed.input_tokens == counted.input_tokens


async def test_the_gateways_errors_on_messages_are_anthropics_shape(tmp_path):
    async with (
        sim_stack(tmp_path, sim_policy(), sim()) as stack,
        httpx.AsyncClient(timeout=30) as c,
        claude(stack.url) as client,
    ):
        missing = await c.post(stack.url + "/v1/messages", json={"model": MODEL, "messages": ASK})
        assert missing.status_code == 400
        assert missing.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"},
        }
        bad = await c.post(stack.url + "/v1/messages", content=b"{")
        assert bad.status_code == 400 and bad.json()["type"] == "error"
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await client.messages.create(model="nope", max_tokens=5, messages=ASK)
        assert unknown.value.body == {
            "type": "error",
            "error": {
                "type": "not_found_error",
                "message": "The model `nope` does not exist. Served models: qwen3-32b.",
            },
        }
        with pytest.raises(anthropic.BadRequestError) as refused:  # the pool's own refusal
            await client.messages.create(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": []}]
            )
        assert refused.value.body["error"]["type"] == "invalid_request_error"
        chat = await c.post(stack.url + "/v1/chat/completions", json={"model": MODEL})
        assert chat.status_code == 400 and "type" not in chat.json()  # OpenAI's shape there


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"thinking": {"type": "enabled", "budget_tokens": 500}}, "budget_tokens"),
    ],
    ids=["robot", "thinking budget"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_what_the_pool_refuses_reaches_the_sdk_in_anthropics_shape(
    tmp_path, change, says, stream
):
    """vLLM answers what its Messages model refuses in its OpenAI shape; speclane hands it
    on in Anthropic's, with the type of its status and vLLM's message."""
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 2000, "messages": ASK} | change
    async with (
        sim_stack(tmp_path, sim_policy(), sim()) as stack,
        claude(stack.url) as client,
        httpx.AsyncClient(timeout=30) as c,
    ):
        direct = await c.post(stack.spec + "/v1/messages", json=request)
        assert direct.status_code == 400 and "type" not in direct.json()  # vLLM's shape
        with pytest.raises(anthropic.BadRequestError) as refused:
            if stream:
                async with client.messages.stream(**request) as events:
                    await events.get_final_message()
            else:
                await client.messages.create(**request)
        counted = await c.post(stack.url + "/v1/messages/count_tokens", json=request)
    body = refused.value.body
    assert isinstance(body, dict) and body.keys() == {"type", "error"} and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == direct.json()["error"]["message"] and says in str(body)
    assert refused.value.response.headers["x-speclane-pool"] == "spec"
    assert counted.status_code == 400 and counted.json() == body


TENANTS = f"""
tenants:
  acme: {{{{api_keys: ["{key_hash("sk-acme")}"]}}}}
"""


async def test_x_api_key_names_the_tenant_and_opens_the_admin_api(tmp_path):
    policy = sim_policy() + TENANTS
    async with (
        sim_stack(tmp_path, policy, sim(), require_api_key=True, admin_token="root") as stack,
        httpx.AsyncClient(timeout=30) as c,
        claude(stack.url, "sk-acme") as client,
        claude(stack.url, "sk-who") as stranger,
    ):
        answer = await client.messages.create(model=MODEL, max_tokens=5, messages=ASK)
        assert answer.content
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await stranger.messages.create(model=MODEL, max_tokens=5, messages=ASK)
        assert refused.value.body["error"]["type"] == "authentication_error"
        flags = await c.get(stack.url + "/admin/flags", headers={"x-api-key": "root"})
        assert flags.status_code == 200
        wrong = await c.get(stack.url + "/admin/flags", headers={"x-api-key": "nope"})
        assert wrong.status_code == 403


async def test_responses_plain_streamed_tools_and_structured(tmp_path):
    async with sim_stack(tmp_path, sim_policy(), sim()) as stack, codex(stack.url) as client:
        plain = await client.responses.create(
            model=MODEL, input="Write python to add two numbers.", max_output_tokens=40
        )
        assert plain.output_text and plain.usage is not None and plain.usage.output_tokens > 0
        stream = await client.responses.create(
            model=MODEL,
            instructions="Answer briefly.",
            input=[{"role": "user", "content": "Write python to add two numbers."}],
            max_output_tokens=40,
            stream=True,
        )
        events = [event async for event in stream]
        assert events[0].type == "response.created"
        assert events[-1].type == "response.completed"  # vLLM's last event, cut short or not
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas and events[-1].response.output_text == deltas
        called = await client.responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[FUNCTION],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=400,
        )
        (call,) = [item for item in called.output if item.type == "function_call"]
        assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
        structured = await client.responses.create(
            model=MODEL,
            input="Extract the name and age as JSON: Ada, 36.",
            text={"format": PERSON},  # type: ignore[typeddict-item]
            max_output_tokens=400,
        )
        assert set(json.loads(structured.output_text)) == {"name", "age"}


def blocks(body: bytes) -> list[bytes]:
    """A stream's events, each as its bytes, without the time it was made and the tool call
    ids the simulator draws per request."""
    unstamped = re.sub(rb'"created_at":\d+', b"", body)
    unstamped = re.sub(rb"chatcmpl-tool-[0-9a-f]+", b"call", unstamped)
    return [event for event in unstamped.split(b"\n\n") if event]


# greedy: the simulator's answer depends on the request alone
MESSAGES = {"model": MODEL, "max_tokens": 40, "messages": ASK, "stream": True, "temperature": 0}
RESPONSES = {
    "model": MODEL,
    "input": ASK,
    "max_output_tokens": 40,
    "stream": True,
    "temperature": 0,
}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", MESSAGES),
        ("/v1/messages", {**MESSAGES, "tools": [WEATHER], "tool_choice": {"type": "any"}}),
        ("/v1/responses", RESPONSES),
        ("/v1/responses", {**RESPONSES, "tools": [FUNCTION], "tool_choice": "required"}),
    ],
)
async def test_streams_are_the_pools_own_event_by_event(tmp_path, path, body):
    async with (
        sim_stack(tmp_path, sim_policy(start="standard"), sim()) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        direct = stack.services.pools.endpoints["standard"][0].url
        headers = {"x-request-id": "same-id", "anthropic-version": "2023-06-01"}
        ours = await c.post(stack.url + path, json=body, headers=headers)
        theirs = await c.post(direct + path, json=body, headers=headers)
        assert ours.status_code == theirs.status_code == 200
        assert ours.headers["content-type"].startswith("text/event-stream")
        assert blocks(ours.content) == blocks(theirs.content)
        assert b"[DONE]" not in ours.content  # vLLM 0.32 ends both at their last event
        whole = {**body, "stream": False}
        ours = await c.post(stack.url + path, json=whole, headers=headers)
        theirs = await c.post(direct + path, json=whole, headers=headers)
        assert blocks(ours.content) == blocks(theirs.content)


async def test_agent_streams_are_measured_by_their_chunks(tmp_path):
    async with (
        sim_stack(tmp_path, sim_policy(), sim()) as stack,
        claude(stack.url) as messages,
        codex(stack.url) as responses,
    ):
        async with messages.messages.stream(model=MODEL, max_tokens=40, messages=ASK) as s:
            await s.get_final_message()
        stream = await responses.responses.create(
            model=MODEL, input="Write python to add two numbers.", max_output_tokens=40, stream=True
        )
        [event async for event in stream]
        # the two answers (not a mirror the guardrail may send to learn the standard pool)
        records = [r for r in stack.services.outcomes.recent() if not r["shadow"]]
    assert [r["pool"] for r in records] == ["spec", "spec"]
    assert {r["signal"] for r in records} == {"chunks"}
    assert all(r["completion_tokens"] == 40 and r["steps"] for r in records)


async def test_the_demos_coding_agent_holds_a_conversation_of_tool_calls(tmp_path):
    async with (
        sim_stack(tmp_path, sim_policy(), sim()) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        talk = Conversation.start(0, seed=7)
        turns = []
        going = True
        while going:
            ask = DemoRequest(len(turns), Workload.TOOLS, talk.body(), {})
            result, content = await send_messages(c, stack.url, ask, lambda: 0.0)
            assert result.ok and result.pool == "spec" and result.completion_tokens > 0
            turns.append([block["type"] for block in content])
            going = talk.answered(content)
    assert turns[:-1] == [["tool_use"]] * (len(turns) - 1) and len(turns) == 3
    uses = [b for m in talk.messages if m["role"] == "assistant" for b in m["content"]]
    assert all(set(use["input"]) <= {"path", "target"} and use["input"] for use in uses)
    assert result.body["messages"][0]["role"] == "system"  # priced as the chat it becomes


async def test_a_pinned_request_goes_to_its_endpoint_whatever_the_rungs(tmp_path):
    async with sim_stack(tmp_path, sim_policy(), sim()) as stack:
        pools = stack.services.pools
        std = pools.endpoints["standard"][0].url
        body = json.dumps({**RESPONSES, "input": "hello"}).encode()
        headers = {"content-type": "application/json"}
        opened = await pools.open(["spec", "standard"], "/v1/responses", body, headers)
        assert opened.spec.name == "spec"
        opened.close()
        pinned = await pools.open(
            ["spec", "standard"],
            "/v1/responses",
            body,
            headers,
            opening=RESPONSES_API.opening,
            pinned=std,
        )
        assert pinned.spec.name == "standard" and pinned.endpoint.url == std
        assert pinned.stream.first.startswith(b"event: response.created\ndata: {")
        pinned.close()
        with pytest.raises(Unavailable):
            await pools.open(["spec"], "/v1/responses", body, headers, pinned="http://gone:1")


async def test_a_stored_response_is_continued_only_where_it_was_made(tmp_path):
    async with (
        sim_stack(tmp_path, sim_policy(), sim()) as stack,
        codex(stack.spec) as spec,
        codex(stack.services.pools.endpoints["standard"][0].url) as standard,
    ):
        first = await spec.responses.create(model=MODEL, input="Hello there.", max_output_tokens=8)
        second = await spec.responses.create(
            model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=8
        )
        assert second.usage is not None and first.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens  # the history came along
        with pytest.raises(openai.NotFoundError):
            await standard.responses.create(
                model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=8
            )


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)]
)
async def test_a_stream_cut_part_way_ends_with_an_error_event_in_the_apis_shape(
    tmp_path, path, body
):
    async with (
        sim_stack(tmp_path, sim_policy(), sim()) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        faults = {"faults": {"die_rate": 1.0, "die_after_chunks": 4}}
        assert (await c.post(stack.spec + "/sim/control", json=faults)).status_code == 200
        answer = await c.post(stack.url + path, json=body)
        assert answer.status_code == 200
        last = blocks(answer.content)[-1]
        if path == "/v1/messages":
            assert last.startswith(
                b'event: error\ndata: {"type":"error","error":{"type":"api_error"'
            )
        else:
            name, data = last.split(b"\n", 1)
            assert name == b"event: error"
            event = json.loads(data.removeprefix(b"data: "))
            assert event["type"] == "error" and event["code"] == "upstream_stream_broken"
            assert event["sequence_number"] > 0  # after the last event relayed
        records = [r for r in stack.services.outcomes.recent() if not r["shadow"]]
        assert [r["status"] for r in records] == ["error"]


SHADOWED = """
version: 1
pools:
  spec: {{kind: speculative, model: qwen3-32b, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules:
  - {{name: mirrored, start: shadow, shadow_fraction: 1.0}}
"""


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)]
)
async def test_agent_requests_are_mirrored_to_speculation_and_measured_there(tmp_path, path, body):
    async with (
        sim_stack(tmp_path, SHADOWED, sim()) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        for whole in (False, True):
            answer = await c.post(stack.url + path, json={**body, "stream": not whole})
            assert answer.status_code == 200 and answer.headers["x-speclane-pool"] == "standard"
        for _ in range(200):
            if not stack.services.shadow.in_flight:
                break
            await asyncio.sleep(0.02)
        records = stack.services.outcomes.recent()
    mirrors = [r for r in records if r["shadow"]]
    assert [r["pool"] for r in mirrors] == ["spec", "spec"]
    assert all(r["status"] == "ok" and r["signal"] == "chunks" for r in mirrors), [
        (r["status"], r["signal"], r.get("error")) for r in mirrors
    ]


async def test_each_stored_response_is_pinned_to_the_endpoint_that_stored_it(tmp_path):
    async with sim_stack(tmp_path, sim_policy(), sim()) as stack, codex(stack.url) as client:
        whole = await client.responses.create(model=MODEL, input="Hello.", max_output_tokens=8)
        stream = await client.responses.create(
            model=MODEL, input="Hello.", max_output_tokens=8, stream=True
        )
        events = [event async for event in stream]
        pins = stack.services.pins
        assert await pins.where(ANONYMOUS, whole.id) == stack.spec
        assert await pins.where(ANONYMOUS, events[0].response.id) == stack.spec


STEERED = """
version: 1
pools:
  spec: {{kind: speculative, model: qwen3-32b, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules:
  - {{name: later, match: {{headers: {{x-turn: later}}}}, start: standard}}
  - {{name: default, start: spec}}
"""


async def test_a_continued_response_goes_where_it_is_stored_whatever_the_rule_says(tmp_path):
    async with (
        sim_stack(tmp_path, STEERED, sim()) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        first = await c.post(stack.url + "/v1/responses", json={**RESPONSES, "stream": False})
        assert first.headers["x-speclane-pool"] == "spec"
        later = {"x-turn": "later"}
        turn = {"model": MODEL, "input": "And then?", "max_output_tokens": 8}
        alone = await c.post(stack.url + "/v1/responses", json=turn, headers=later)
        assert alone.headers["x-speclane-pool"] == "standard"  # the rule, when nothing is pinned
        continued = {**turn, "previous_response_id": first.json()["id"]}
        for stream in (False, True):
            second = await c.post(
                stack.url + "/v1/responses", json={**continued, "stream": stream}, headers=later
            )
            assert second.status_code == 200, second.text
            assert second.headers["x-speclane-pool"] == "spec"
            assert second.headers["x-speclane-reason"].startswith("pinned: response resp_")
        unknown = {**turn, "previous_response_id": "resp_nobody"}
        gone = await c.post(stack.url + "/v1/responses", json=unknown)
        assert gone.status_code == 404 and "x-request-id" in gone.headers
        assert gone.json()["error"]["message"] == "Response with id 'resp_nobody' not found."
        read = await c.get(stack.url + "/v1/responses/" + first.json()["id"])
        assert read.status_code == 200 and read.json()["id"] == first.json()["id"]


async def test_anthropics_version_headers_go_upstream_and_the_key_does_not(tmp_path):
    seen: list[dict[str, str]] = []
    inner = sim_app(SimConfig(time_scale=0.01))

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/messages":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await inner(scope, receive, send)

    standard = sim_app(SimConfig(mode=Mode.STANDARD, time_scale=0.01))
    async with (
        fake_stack(tmp_path, recording, standard, sim_policy()) as (url, _),
        claude(url, "sk-secret") as client,
    ):
        await client.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=ASK,
            extra_headers={"anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024-04-04"},
        )
    (headers,) = seen
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "tools-2024-04-04"
    assert "x-api-key" not in headers and "authorization" not in headers
