"""The simulated vLLM under uvicorn on loopback: shapes, numbers, control, faults, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from backends.sim.config import Faults, Mode, SimConfig
from backends.sim.model import DriftPoint
from backends.sim.server import serve
from backends.sim.virtual import TimedRequest, simulate
from backends.sim.workload import Workload

pytestmark = pytest.mark.anyio

Server = Callable[[SimConfig], contextlib.AbstractAsyncContextManager[str]]
Shape = Callable[[object], object]
FAST = SimConfig(served_model_names=("tiny",), time_scale=0.02, seed=11)
CODE = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "write python"}],
    "temperature": 0,
}


def code(**extra: Any) -> dict[str, Any]:
    return CODE | extra


@contextlib.asynccontextmanager
async def client(server: Server, config: SimConfig = FAST) -> AsyncIterator[httpx.AsyncClient]:
    async with server(config) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:
        yield c


async def stream(
    c: httpx.AsyncClient, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> list[Any]:
    """The ``data:`` payloads of one streamed answer (``[DONE]`` kept as bytes)."""
    out: list[Any] = []
    async with c.stream("POST", path, json=body | {"stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(b"[DONE]" if data == "[DONE]" else orjson.loads(data))
    return out


def split(events: list[Any]) -> tuple[Any, list[Any], Any]:
    """Role chunk, content chunks, usage chunk (or None); checks the [DONE] at the end."""
    assert events[-1] == b"[DONE]"
    body = events[:-1]
    usage = body.pop() if body[-1]["choices"] == [] else None
    return body[0], body[1:], usage


async def test_stream_one_chunk_per_step_and_consistent_metrics(
    sim_server: Server, fixture_sse: Callable[[str], list[bytes]], json_shape: Shape
) -> None:
    body = code(max_tokens=64, stream_options={"include_usage": True})
    async with client(sim_server) as c:
        events = await stream(c, body)
    role, contents, usage = split(events)
    real = [orjson.loads(e) for e in fixture_sse("chat-stream-include-usage.sse")[:-1]]
    assert json_shape(role) == json_shape(real[0])
    assert {json_shape(x) for x in map(repr, contents)}  # all parse
    assert [json_shape(x) for x in contents[:-1]] == [json_shape(real[1])] * (len(contents) - 1)
    assert json_shape(contents[-1]) == json_shape(real[-2])
    assert json_shape(usage) == json_shape(real[-1])
    spec = usage["metrics"]["speculative_decoding"]
    steps, accepted, drafted = (
        spec["num_spec_steps"],
        spec["num_accepted_draft_tokens"],
        spec["num_draft_tokens"],
    )
    assert len(contents) == steps + 1  # the prefill token, then one chunk per speculative step
    assert accepted <= drafted == 4 * steps
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / drafted)
    assert sum(spec["acceptance_histogram"]) == steps
    assert usage["usage"]["completion_tokens"] == 64
    assert contents[-1]["choices"][0]["finish_reason"] == "length"
    assert steps + 1 <= 64 <= 1 + steps + accepted
    # Same seed, same request order: the virtual engine tells the same story.
    (twin,) = simulate([TimedRequest(0.0, body)], FAST)
    assert (twin.num_spec_steps, twin.num_accepted_draft_tokens) == (steps, accepted)
    assert twin.completion_tokens == 64


async def test_stream_text_equals_nonstream_text_for_the_same_seed(sim_server: Server) -> None:
    body = code(max_tokens=40)
    async with client(sim_server) as c:
        _, contents, _ = split(await stream(c, body))
    async with client(sim_server) as c:
        whole = (await c.post("/v1/chat/completions", json=body)).json()
    streamed = "".join(x["choices"][0]["delta"]["content"] for x in contents)
    assert streamed == whole["choices"][0]["message"]["content"]


async def test_usage_chunk_only_when_asked(
    sim_server: Server, fixture_sse: Callable[[str], list[bytes]], json_shape: Shape
) -> None:
    async with client(sim_server) as c:
        events = await stream(c, code(max_tokens=16))
    _, contents, usage = split(events)
    assert usage is None
    real_last = orjson.loads(fixture_sse("chat-stream.sse")[-2])
    assert json_shape(contents[-1]) == json_shape(real_last)


async def test_nonstream_body(
    sim_server: Server, fixture_json: Callable[[str], object], json_shape: Shape
) -> None:
    async with client(sim_server) as c:
        r = await c.post("/v1/chat/completions", json=code(max_completion_tokens=2000))
    body = r.json()
    assert r.status_code == 200 and json_shape(body) == json_shape(
        fixture_json("chat-nonstream.json")
    )
    choice, usage = body["choices"][0], body["usage"]
    assert choice["finish_reason"] == "stop" and usage["completion_tokens"] < 2000
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    spec = body["metrics"]["speculative_decoding"]
    assert spec["num_accepted_draft_tokens"] <= spec["num_draft_tokens"]
    assert spec["num_spec_tokens"] == 4


async def test_completions_stream(
    sim_server: Server, fixture_sse: Callable[[str], list[bytes]], json_shape: Shape
) -> None:
    body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 24}
    async with client(sim_server) as c:
        events = await stream(
            c, body | {"stream_options": {"include_usage": True}}, "/v1/completions"
        )
        plain = (await c.post("/v1/completions", json=body)).json()
    real = [orjson.loads(e) for e in fixture_sse("completions-stream-include-usage.sse")[:-1]]
    assert events[-1] == b"[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert json_shape(chunks[0]) == json_shape(real[0])
    assert json_shape(chunks[-1]) == json_shape(real[-2])
    assert json_shape(usage) == json_shape(real[-1])
    assert len(chunks) == usage["metrics"]["speculative_decoding"]["num_spec_steps"] + 1
    assert plain["object"] == "text_completion" and plain["usage"]["completion_tokens"] == 24


async def test_standard_mode_has_no_spec_metrics(sim_server: Server) -> None:
    config = SimConfig(mode=Mode.STANDARD, served_model_names=("tiny",), time_scale=0.01)
    body = code(max_tokens=12, stream_options={"include_usage": True})
    async with client(sim_server, config) as c:
        _, contents, usage = split(await stream(c, body))
        whole = (await c.post("/v1/chat/completions", json=code(max_tokens=5))).json()
        metrics = (await c.get("/metrics")).text
    assert len(contents) == 12 and "metrics" not in usage
    assert whole["metrics"] is None
    assert "spec_decode" not in metrics and "vllm:generation_tokens_total" in metrics


async def test_stream_interval_holds_tokens_back(sim_server: Server) -> None:
    """vLLM's --stream-interval counts tokens: the first goes alone, then a chunk leaves once
    at least N tokens wait, and the last chunk leaves when the answer ends."""
    config = SimConfig(
        served_model_names=("tiny",), time_scale=0.01, stream_interval=6, mode=Mode.STANDARD
    )
    body = code(max_tokens=80, ignore_eos=True, stream_options={"include_usage": True})
    async with client(sim_server, config) as c:
        _, contents, usage = split(await stream(c, body))
    assert usage["usage"]["completion_tokens"] == 80
    assert len(contents) == 1 + math.ceil(79 / 6)
    spec = SimConfig(served_model_names=("tiny",), time_scale=0.01, stream_interval=6)
    async with client(sim_server, spec) as c:
        _, contents, usage = split(await stream(c, body))
    steps = usage["metrics"]["speculative_decoding"]["num_spec_steps"]
    assert 1 + math.ceil(79 / 5 / 6) <= len(contents) - 1 < steps  # fewer chunks than steps


async def test_tool_call_stream(sim_server: Server) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    body = code(tools=[tool], tool_choice="required", max_tokens=500)
    async with client(sim_server) as c:
        _, contents, _ = split(await stream(c, body))
    calls = [x["choices"][0]["delta"]["tool_calls"][0] for x in contents]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert "city" in orjson.loads(arguments)
    assert contents[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("raw", "status", "param"),
    [
        (b'{"model": "tiny", ', 400, "body.18"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
        (b'{"model": "tiny"}', 400, "body.messages"),
        (b"[1]", 400, "body"),
        (b'{"messages": [{"role": "user", "content": "x"}], "top_p": 0}', 400, "top_p"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400, "max_tokens"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999}',
            400,
            "max_tokens",
        ),
    ],
)
async def test_errors(
    sim_server: Server,
    fixture_json: Callable[[str], object],
    json_shape: Shape,
    raw: bytes,
    status: int,
    param: str,
) -> None:
    async with client(sim_server) as c:
        r = await c.post("/v1/chat/completions", content=raw)
        missing = await c.post("/v1/completions", json={"model": "tiny"})
    assert r.status_code == status and r.json()["error"]["param"] == param
    assert r.json()["error"]["code"] == status
    assert json_shape(r.json()) == json_shape(fixture_json("error-unknown-model.json"))
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


async def test_models_health_and_metrics(
    sim_server: Server, fixture_json: Callable[[str], object], json_shape: Shape
) -> None:
    async with client(sim_server) as c:
        models = (await c.get("/v1/models")).json()
        assert (await c.get("/health")).status_code == 200
        before = (await c.get("/metrics")).text
        await c.post("/v1/chat/completions", json=code(max_tokens=30))
        after = (await c.get("/metrics")).text
    assert json_shape(models) == json_shape(fixture_json("models.json"))
    assert models["data"][0]["id"] == "tiny"
    label = '{engine="0",model_name="tiny"}'
    for name in (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:prompt_tokens_total",
    ):
        assert f"{name}{label} 0.0" in before
        assert f"{name}{label} 0.0" not in after
    assert f"vllm:generation_tokens_total{label} 30.0" in after
    assert (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="3"}'
        in after
    )
    assert f"vllm:num_requests_running{label} 0.0" in after
    assert f"vllm:num_requests_waiting{label} 0.0" in after


async def test_neuron_mode_reports_no_draft_tokens(sim_server: Server) -> None:
    config = SimConfig(served_model_names=("tiny",), time_scale=0.01, report_spec_metrics=False)
    async with client(sim_server, config) as c:
        whole = (await c.post("/v1/chat/completions", json=code(max_tokens=20))).json()
        metrics = (await c.get("/metrics")).text
    assert whole["metrics"] is None
    assert 'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 0.0' in metrics


async def test_control_drift_takes_effect_and_clears(sim_server: Server) -> None:
    async with client(sim_server) as c:
        state = (await c.post("/sim/control", json={"acceptance": {"code": 0.0}})).json()
        assert state["acceptance"]["code"] == 0.0 and state["overrides"] == {"code": 0.0}
        dead = (await c.post("/v1/chat/completions", json=code(max_tokens=40))).json()
        state = (await c.post("/sim/control", json={"acceptance": {"code": None}})).json()
        assert state["acceptance"]["code"] == 0.82 and state["overrides"] == {}
        await c.post("/sim/control", json={"acceptance": {"json": 0.5}})
        state = (await c.post("/sim/control", json={"acceptance": None})).json()
        assert state["overrides"] == {}
        live = (await c.post("/v1/chat/completions", json=code(max_tokens=40))).json()
        bad = [
            await c.post("/sim/control", json={"acceptance": {"nope": 0.1}}),
            await c.post("/sim/control", json={"acceptance": {"code": 2}}),
            await c.post("/sim/control", json={"faults": {"nope": 1}}),
            await c.post("/sim/control", json={"faults": {"error_rate": 3}}),
            await c.post("/sim/control", json={"other": 1}),
            await c.post("/sim/control", json=[1]),
            await c.post("/sim/control", content=b"{"),
        ]
        final = (await c.get("/sim/state")).json()
    assert dead["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] == 0
    assert live["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] > 0
    assert [r.status_code for r in bad] == [400] * len(bad)
    assert final["faults"] == {
        "error_rate": 0.0,
        "spike_rate": 0.0,
        "spike_s": 1.0,
        "die_rate": 0.0,
        "die_after_chunks": 3,
        "stall_rate": 0.0,
        "hang_rate": 0.0,
        "overloaded": False,
        "greedy_mismatch": 0.0,
        "broken_structure": 0.0,
    }
    assert final["outcomes"]["requests"] == 2 and final["outcomes"]["completed"] == 2


async def test_error_and_overload_faults(sim_server: Server, json_shape: Shape) -> None:
    async with client(sim_server) as c:
        await c.post("/sim/control", json={"faults": {"error_rate": 1.0}})
        failed = await c.post("/v1/chat/completions", json=code())
        await c.post("/sim/control", json={"faults": {"error_rate": 0.0, "overloaded": True}})
        busy = await c.post("/v1/chat/completions", json=code(stream=True))
        state = (await c.get("/sim/state")).json()
    assert failed.status_code == 500 and failed.json()["error"]["code"] == 500
    assert busy.status_code == 503 and busy.json()["error"]["type"] == "ServiceUnavailableError"
    assert state["outcomes"]["errors_injected"] == 1 and state["outcomes"]["overloaded"] == 1


async def test_spike_delays_the_first_byte(sim_server: Server) -> None:
    config = SimConfig(time_scale=0.1, faults=Faults(spike_rate=1.0, spike_s=2.0))
    loop = asyncio.get_running_loop()
    async with client(sim_server, config) as c:
        start = loop.time()
        r = await c.post(
            "/v1/chat/completions", json={"messages": CODE["messages"], "max_tokens": 1}
        )
        waited = loop.time() - start
    assert r.status_code == 200 and waited >= 0.2


async def test_die_drops_the_stream_mid_way(sim_server: Server) -> None:
    config = SimConfig(
        served_model_names=("tiny",),
        time_scale=0.02,
        faults=Faults(die_rate=1.0, die_after_chunks=3),
    )
    lines: list[str] = []
    async with client(sim_server, config) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            async with c.stream("POST", "/v1/chat/completions", json=code(stream=True)) as r:
                async for line in r.aiter_lines():
                    if line:
                        lines.append(line)
        state = await wait_for(c, lambda s: s["outcomes"]["cancelled"] == 1)
    assert len(lines) == 3 and "[DONE]" not in "".join(lines)
    assert state["outcomes"]["drops"] == 1 and state["running"] == 0


async def test_stall_goes_silent_mid_way_and_hang_never_answers(sim_server: Server) -> None:
    stall = SimConfig(
        served_model_names=("tiny",),
        time_scale=0.02,
        faults=Faults(stall_rate=1.0, die_after_chunks=2),
    )
    lines: list[str] = []
    async with client(sim_server, stall) as c:
        with pytest.raises(httpx.ReadTimeout):
            async with c.stream(
                "POST", "/v1/chat/completions", json=code(stream=True), timeout=0.5
            ) as r:
                async for line in r.aiter_lines():
                    if line:
                        lines.append(line)
        state = await wait_for(c, lambda s: s["running"] == 0)
    assert len(lines) == 2 and state["outcomes"]["stalls"] == 1

    hang = SimConfig(served_model_names=("tiny",), time_scale=0.02, faults=Faults(hang_rate=1.0))
    async with client(sim_server, hang) as c:
        for body in (code(), code(stream=True)):
            with pytest.raises(httpx.ReadTimeout):
                async with c.stream("POST", "/v1/chat/completions", json=body, timeout=0.3) as r:
                    async for _ in r.aiter_bytes():
                        pass
        state = await wait_for(c, lambda s: s["outcomes"]["cancelled"] == 2)
    assert state["outcomes"]["hangs"] == 2 and state["running"] == 0


async def test_disconnect_cancels_the_sequence(sim_server: Server) -> None:
    config = SimConfig(served_model_names=("tiny",), mode=Mode.STANDARD, time_scale=0.5)
    async with client(sim_server, config) as c:
        async with c.stream("POST", "/v1/chat/completions", json=code(stream=True)) as r:
            got = 0
            async for line in r.aiter_lines():
                got += line.startswith("data: ")
                if got == 3:
                    break
        state = await wait_for(c, lambda s: s["outcomes"]["cancelled"] == 1)
        assert state["running"] == 0 and state["waiting"] == 0
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/chat/completions", json=code(max_tokens=400), timeout=0.2)
        state = await wait_for(c, lambda s: s["outcomes"]["cancelled"] == 2)
    assert state["running"] == 0 and state["outcomes"]["completed"] == 0


async def test_batch_limit_shows_waiting_requests(sim_server: Server) -> None:
    config = SimConfig(served_model_names=("tiny",), max_num_seqs=1, time_scale=0.2)
    release = asyncio.Event()
    async with client(sim_server, config) as c:

        async def hold_open() -> None:
            async with c.stream("POST", "/v1/chat/completions", json=code(stream=True)) as r:
                async for _ in r.aiter_lines():
                    await release.wait()
                    break

        tasks = [asyncio.create_task(hold_open()) for _ in range(3)]
        state = await wait_for(c, lambda s: s["running"] == 1 and s["waiting"] == 2)
        metrics = (await c.get("/metrics")).text
        release.set()
        await asyncio.gather(*tasks)
    assert 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0' in metrics
    assert state["outcomes"]["requests"] == 3


async def test_zero_latency_mode(sim_server: Server) -> None:
    config = SimConfig(served_model_names=("tiny",), zero_latency=True)
    body = code(max_tokens=50, stream_options={"include_usage": True})
    async with client(sim_server, config) as c:
        _, contents, usage = split(await stream(c, body))
        whole = (await c.post("/v1/chat/completions", json=code(max_tokens=50))).json()
    assert len(contents) == usage["metrics"]["speculative_decoding"]["num_spec_steps"] + 1
    assert whole["usage"]["completion_tokens"] == 50


async def test_openai_client_reads_the_stream(sim_server: Server) -> None:
    async with sim_server(FAST) as url:
        api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none")
        try:
            chunks = await api.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "give me json"}],
                response_format={"type": "json_object"},
                temperature=0,
                max_tokens=500,
                stream=True,
                stream_options={"include_usage": True},
            )
            parts = [chunk async for chunk in chunks]
        finally:
            await api.close()
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert isinstance(orjson.loads(text), dict)
    assert parts[-1].usage is not None and parts[-1].usage.completion_tokens > 0


async def wait_for(c: httpx.AsyncClient, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    for _ in range(300):
        state: dict[str, Any] = (await c.get("/sim/state")).json()
        if ready(state):
            return state
        await asyncio.sleep(0.01)
    raise AssertionError(f"state never got ready: {state}")


async def test_drift_schedule_from_config(sim_server: Server) -> None:
    drift = (DriftPoint(Workload.CODE, 0.0, 0.0),)
    config = SimConfig(served_model_names=("tiny",), time_scale=0.01, drift=drift)
    async with client(sim_server, config) as c:
        body = (await c.post("/v1/chat/completions", json=code(max_tokens=30))).json()
        state = (await c.get("/sim/state")).json()
    assert body["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] == 0
    assert state["acceptance"]["code"] == 0.0 and state["overrides"] == {}


async def test_serve_runs_until_cancelled() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    task = asyncio.create_task(serve(FAST, "127.0.0.1", port))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        for _ in range(200):
            with contextlib.suppress(httpx.ConnectError):
                if (await c.get("/health")).status_code == 200:
                    break
            await asyncio.sleep(0.01)
        body = (await c.post("/v1/chat/completions", json=code(max_tokens=3))).json()
    assert body["usage"]["completion_tokens"] == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_root_and_an_unknown_model_name_what_is_served(sim_server: Server) -> None:
    """The card's root is vLLM's --model (where init reads generation_config.json); every 404
    for an unknown model names the served ones, as vLLM 0.32's does."""
    config = SimConfig(served_model_names=("tiny", "tiny-2"), time_scale=0.02, root="/m/tiny")
    async with client(sim_server, config) as c:
        models = (await c.get("/v1/models")).json()
        card = await c.get("/v1/models/nope")
        counted = await c.post(
            "/v1/messages/count_tokens",
            json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert [m["root"] for m in models["data"]] == ["/m/tiny", "/m/tiny"]
    for answer in (card, counted):
        assert answer.status_code == 404
        assert "Valid aliases: tiny, tiny-2." in answer.text


async def test_a_request_without_temperature_is_sampled_at_the_models_default(
    sim_server: Server,
) -> None:
    """As vLLM applies the model's generation_config.json: a request without a temperature
    is answered as one at the model's default (each answer the first of a fresh server, so
    the same sampling gives the same numbers)."""
    story = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}]}
    story["max_tokens"] = 64

    async def metrics(default: float | None, **extra: object) -> object:
        config = SimConfig(
            served_model_names=("tiny",), time_scale=0.01, seed=3, default_temperature=default
        )
        async with client(sim_server, config) as c:
            answer = await c.post("/v1/chat/completions", json={**story, **extra})
        return answer.json()["metrics"]

    assert await metrics(None) == await metrics(None, temperature=1.0)  # vLLM's own 1.0
    assert await metrics(0.6) == await metrics(None, temperature=0.6)
    assert await metrics(0.6) != await metrics(None)
    assert await metrics(0.6, temperature=1.0) == await metrics(None, temperature=1.0)
