"""Drive the demo's traffic through the gateway and record what every request saw.

``concurrency`` workers each send one streamed request at a time, taking the next one from
the seeded mix, until the run's duration is over; requests still in flight then finish.
Client-side timing: TTFT is send to first content chunk, time per output token is first to
last content chunk over the tokens after the first. The usage chunk's
``metrics.speculative_decoding`` is kept when the speculative pool reports it. A drift task
makes the speculative pool's code acceptance collapse and recover on schedule, and a watcher
polls the admin API for guardrail events as they happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from backends.sim.agents import chat_of
from backends.sim.model import DEFAULT_BASE
from backends.sim.workload import Workload
from gateway.demo import agent
from gateway.demo.workload import DemoRequest, Mix

COLLAPSED_ACCEPTANCE = 0.05


@dataclass(slots=True)
class Result:
    """One request as the client saw it; ``at`` is seconds since the run started."""

    index: int
    workload: Workload
    at: float
    body: dict[str, Any]
    pool: str = ""
    rule: str = ""
    slice: str = ""
    reason: str = ""
    status: int = 0
    error: str = ""
    ttft_s: float | None = None
    tpot_s: float | None = None
    completion_tokens: int = 0
    spec_steps: int = 0
    accepted: int = 0
    drafted: int = 0
    done_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def mirrored(self) -> bool:
        return "mirrored to" in self.reason


@dataclass(frozen=True, slots=True)
class Drift:
    """When (fractions of the run) the speculative pool's code acceptance collapses, recovers."""

    collapse_at: float = 0.30
    recover_at: float = 0.50
    collapsed: float = COLLAPSED_ACCEPTANCE
    healthy: float = DEFAULT_BASE[Workload.CODE]


@dataclass(slots=True)
class RunState:
    """Everything the run has produced so far; the live display reads it."""

    duration_s: float
    started: float = 0.0
    results: list[Result] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    drift_marks: dict[str, float] = field(default_factory=dict)
    wall_start: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started if self.started else 0.0


@dataclass(frozen=True, slots=True)
class Target:
    gateway: str
    spec: str
    admin_token: str


async def run(
    target: Target,
    mix: Mix,
    state: RunState,
    *,
    concurrency: int,
    drift: Drift,
    poll_s: float = 0.5,
    drain_s: float = 30.0,
    agents: int = 0,
    seed: int = 0,
) -> None:
    """Send traffic for ``state.duration_s`` seconds, then give requests in flight
    ``drain_s`` more to finish (the rest are cancelled, unrecorded); fills ``state``.
    ``agents`` coding agents (``gateway/demo/agent.py``) run beside the mix's
    ``concurrency`` workers, each one conversation at a time."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(120.0, connect=5.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        state.started = time.perf_counter()
        state.wall_start = time.time()
        counter = itertools.count()
        background = [
            asyncio.create_task(_drift(client, target.spec, state, drift)),
            asyncio.create_task(_watch(client, target, state, poll_s)),
        ]
        try:
            workers = [
                *(_worker(client, target.gateway, mix, counter, state) for _ in range(concurrency)),
                *(_agent(client, target.gateway, counter, state, seed) for _ in range(agents)),
            ]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*workers), state.duration_s + drain_s)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        state.events = await guardrail_events(client, target)


async def _worker(
    client: httpx.AsyncClient,
    url: str,
    mix: Mix,
    counter: itertools.count[int],
    state: RunState,
) -> None:
    while state.elapsed() < state.duration_s:
        request = mix.request(next(counter))
        state.results.append(await send(client, url, request, state.elapsed))


async def _agent(
    client: httpx.AsyncClient, url: str, counter: itertools.count[int], state: RunState, seed: int
) -> None:
    """One coding agent: conversations of several turns over ``/v1/messages``."""
    while state.elapsed() < state.duration_s:
        talk = agent.Conversation.start(next(counter), seed)
        going = True
        while going and state.elapsed() < state.duration_s:
            body = talk.body()
            request = DemoRequest(next(counter), Workload.TOOLS, body, {})
            result, content = await send_messages(client, url, request, state.elapsed)
            state.results.append(result)
            going = result.ok and talk.answered(content)


async def send_messages(
    client: httpx.AsyncClient, url: str, request: DemoRequest, now: Callable[[], float]
) -> tuple[Result, list[dict[str, Any]]]:
    """Send one streamed Messages request; the result (its body as the chat request the
    pools run, which the demo's pricing reads) and the answer's content blocks."""
    body = dict(request.body)
    result = Result(request.index, request.workload, now(), chat_of(agent.PATH, body))
    sent = time.perf_counter()
    content: list[dict[str, Any]] = []
    try:
        async with client.stream("POST", url + agent.PATH, json=body) as response:
            _headers(result, response)
            if response.status_code != 200:
                result.error = (await response.aread()).decode(errors="replace")[:200]
            else:
                content = await _read_events(response, result, sent)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.done_at = now()
    return result, content


def _headers(result: Result, response: httpx.Response) -> None:
    result.status = response.status_code
    h = response.headers
    result.pool, result.rule = h.get("x-speclane-pool", ""), h.get("x-speclane-rule", "")
    result.slice, result.reason = h.get("x-speclane-slice", ""), h.get("x-speclane-reason", "")


async def _read_events(
    response: httpx.Response, result: Result, sent: float
) -> list[dict[str, Any]]:
    """An Anthropic event stream: the content blocks it made, timed as chunks are."""
    blocks: list[dict[str, Any]] = []
    inputs: list[str] = []
    first = last = None
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = orjson.loads(line[6:])
        kind = event.get("type")
        if kind == "error":
            result.error = str(event.get("error"))[:200]
            return []
        if kind == "content_block_start":
            blocks.append(dict(event["content_block"]))
            inputs.append("")
        elif kind == "content_block_delta" and blocks:
            delta = event["delta"]
            last = time.perf_counter()
            first = first or last
            if delta.get("type") == "input_json_delta":
                inputs[-1] += delta.get("partial_json") or ""
            else:
                blocks[-1]["text"] = blocks[-1].get("text", "") + (delta.get("text") or "")
        elif kind == "message_delta":
            result.completion_tokens = int((event.get("usage") or {}).get("output_tokens") or 0)
    for block, given in zip(blocks, inputs, strict=True):
        if block.get("type") == "tool_use":
            try:
                block["input"] = orjson.loads(given or "{}")
            except orjson.JSONDecodeError:
                block["input"] = {}
    if first is not None and last is not None:
        result.ttft_s = first - sent
        if result.completion_tokens > 1:
            result.tpot_s = (last - first) / (result.completion_tokens - 1)
    return blocks


async def send(
    client: httpx.AsyncClient, url: str, request: DemoRequest, now: Callable[[], float]
) -> Result:
    """Send one streamed request and time it; never raises for HTTP or stream failures."""
    result = Result(request.index, request.workload, now(), dict(request.body))
    sent = time.perf_counter()
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=request.body, headers=request.headers
        ) as response:
            _headers(result, response)
            if response.status_code != 200:
                result.error = (await response.aread()).decode(errors="replace")[:200]
            else:
                await _read_stream(response, result, sent)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.done_at = now()
    return result


async def _read_stream(response: httpx.Response, result: Result, sent: float) -> None:
    first = last = None
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = orjson.loads(line[6:])
        if "error" in chunk and not chunk.get("choices"):
            result.error = str(chunk["error"])[:200]
            return
        choices = chunk.get("choices") or []
        delta = choices[0].get("delta", {}) if choices else {}
        if delta.get("content") or delta.get("tool_calls"):
            last = time.perf_counter()
            first = first or last
        if chunk.get("usage"):
            _usage(result, chunk)
    if first is not None and last is not None:
        result.ttft_s = first - sent
        if result.completion_tokens > 1:
            result.tpot_s = (last - first) / (result.completion_tokens - 1)


def _usage(result: Result, chunk: dict[str, Any]) -> None:
    result.completion_tokens = int(chunk["usage"].get("completion_tokens") or 0)
    metrics = chunk.get("metrics") or {}
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(spec, dict):
        result.spec_steps = int(spec.get("num_spec_steps") or 0)
        result.accepted = int(spec.get("num_accepted_draft_tokens") or 0)
        result.drafted = int(spec.get("num_draft_tokens") or 0)


async def _drift(client: httpx.AsyncClient, spec: str, state: RunState, drift: Drift) -> None:
    steps = (
        ("collapse", drift.collapse_at, drift.collapsed),
        ("recover", drift.recover_at, None),
    )
    for name, fraction, value in steps:
        await asyncio.sleep(max(fraction * state.duration_s - state.elapsed(), 0.0))
        body = {"acceptance": {Workload.CODE.value: value}}
        response = await client.post(spec + "/sim/control", json=body)
        response.raise_for_status()
        state.drift_marks[name] = state.elapsed()


async def guardrail_events(client: httpx.AsyncClient, target: Target) -> list[dict[str, Any]]:
    response = await client.get(
        target.gateway + "/admin/guardrail", headers=_auth(target), params={"limit": 1000}
    )
    response.raise_for_status()
    events: list[dict[str, Any]] = response.json()["events"]
    return events


async def admin_get(client: httpx.AsyncClient, target: Target, path: str) -> dict[str, Any]:
    response = await client.get(target.gateway + path, headers=_auth(target))
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def _watch(client: httpx.AsyncClient, target: Target, state: RunState, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            state.events = await guardrail_events(client, target)
        except httpx.HTTPError:
            continue  # the display shows the last events it got; the summary fetches again


def _auth(target: Target) -> dict[str, str]:
    return {"authorization": f"Bearer {target.admin_token}"}
