"""The long forms of the fault suite (issue 9): a real ``speclane serve`` in front of real
``speclane sim`` processes, each in its own process group, driven by the ``openai``-shaped
requests of ``httpx`` clients, each in the shape of its route's API.

- the fault matrix: the simulator's knobs (``/sim/control``: independent errors, streams
  dropped mid-answer, every endpoint overloaded), SIGKILL and SIGSTOP of an endpoint, and
  hostile connections (a slowloris and a header flood) beside normal clients;
- hostile upstreams (``bench/hostile.py``: HTML with 200, non-JSON SSE, a stream that never
  ends, a 200 MB body, a short body under a long ``Content-Length``, HTTP/1.0 without a
  length, one 10 MB event, 429 with ``Retry-After``), each as the only rung of its ladder and
  with a healthy rung below, beside normal traffic: what the client gets, the gateway's RSS
  and event-loop lag (the slowest ``/healthz`` meanwhile), and the normal traffic's errors;
- at least 10,000 fuzzed requests (bodies, headers, methods, paths; each route's own body
  fields, ``x-api-key``, ``anthropic-version``): no 5xx, and every 4xx of a model route in
  its API's shape;
- a soak at concurrency 64 for ``--soak-s`` (default 10 minutes), with the gateway's RSS,
  open file descriptors and event-loop tasks sampled.

Every model route the suite drives is in ``ROUTES``: load, fuzz and hostile rows alike. A
stream is complete at its API's last event (chat and completions: ``[DONE]``; Messages:
``message_stop``; Responses: ``response.completed`` or ``response.incomplete``, neither
followed by ``[DONE]`` on vLLM); every error a client gets, an answer or a stream's final
event, must be in the shape of its route's API (``error_shaped``), or the row fails.

Writes a table (scenario, requests, client errors, expected, verdict) to bench/RESULTS.md
under "Fault suite (issue 9)": the phases run replace their own rows, the others' rows stay
with the commands that wrote them. Usage::

    .venv/bin/python -m bench.faults                       # everything, 10-minute soak
    .venv/bin/python -m bench.faults --soak-s 120 --fuzz 10000
    .venv/bin/python -m bench.faults --only hostile       # one phase

Why one module past 600 lines: its phases share one harness (the process groups, the
clients in each route's shape, ``error_shaped``, the RSS and lag sampling), one route table
(``ROUTES``) and one report: a phase is a short function over those, and a file per phase
would split the table that says what every row expects from the code that checks it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.procs import Child, Supervisor, free_port

MODEL = "qwen3-32b"
RESULTS = Path(__file__).with_name("RESULTS.md")
HEADING = "## Fault suite (issue 9)"
HEALTHY = {"error_rate": 0, "die_rate": 0, "stall_rate": 0, "hang_rate": 0, "overloaded": False}
# every model route the suite drives: OpenAI's chat and completions, Anthropic's Messages,
# OpenAI's Responses
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
CHAT, COMPLETIONS, MESSAGES, RESPONSES = ROUTES
# the events that end a stream well, by route (chat and completions end with [DONE]);
# response.failed ends a Responses stream as its error
_LAST = {MESSAGES: {"message_stop"}, RESPONSES: {"response.completed", "response.incomplete"}}


@dataclass
class Row:
    scenario: str
    requests: int
    errors: int
    expected: str
    verdict: bool
    note: str = ""


@dataclass
class Tally:
    """What clients got: counts per status, and streams that ended without ``[DONE]`` and
    without an error event (silently truncated)."""

    statuses: dict[int, int] = field(default_factory=dict)
    truncated: int = 0
    misshapen: int = 0  # an error (answer or event) not in the shape of its route's API
    by_route: dict[str, int] = field(default_factory=dict)  # client errors per route
    transport: int = 0
    no_retry_after: int = 0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + self.transport

    @property
    def errors(self) -> int:
        return self.requests - self.statuses.get(200, 0) + self.truncated

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


class Stack:
    """Simulators and the gateway as child processes on loopback."""

    def __init__(self, sup: Supervisor, tmp: Path, spec: int = 2, standard: int = 1) -> None:
        self.sup = sup
        self.sims: dict[str, tuple[Child, str]] = {}
        self.down: set[str] = set()  # stopped or killed
        for i in range(spec + standard):
            mode = "speculative" if i < spec else "standard"
            name = f"{mode[:4]}-{i}"
            port = free_port()
            argv = [sys.executable, "-m", "gateway", "sim", "--mode", mode, "--port", str(port)]
            argv += ["--time-scale", "0.01", "--seed", str(i), "--model", MODEL]
            child = sup.start(name, argv)
            url = f"http://127.0.0.1:{port}"
            sup.wait_ready(child, url + "/v1/models")
            self.sims[name] = (child, url)
        spec_urls = [u for n, (_, u) in self.sims.items() if n.startswith("spec")]
        std_urls = [u for n, (_, u) in self.sims.items() if n.startswith("stan")]
        timeouts = "{connect_s: 1, first_byte_s: 2, idle_s: 2}"
        policy = tmp / "policy.yaml"
        policy.write_text(
            f"""
version: 1
pools:
  spec: {{kind: speculative, model: {MODEL}, num_speculative_tokens: 4,
          endpoints: {json.dumps(spec_urls)}, timeouts: {timeouts}}}
  standard: {{kind: standard, model: {MODEL}, endpoints: {json.dumps(std_urls)},
              timeouts: {timeouts}}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""
        )
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
        env |= {
            "SPECLANE_POLICY": str(policy),
            "SPECLANE_PORT": str(port),
            "SPECLANE_LOG_LEVEL": "warning",
            "SPECLANE_HEADER_TIMEOUT_S": "2",
            "SPECLANE_DRAIN_DELAY_S": "0",
        }
        self.gateway = sup.start("gateway", [sys.executable, "-m", "gateway", "serve"], env)
        sup.wait_ready(self.gateway, self.url + "/healthz")

    async def control(self, faults: dict[str, Any]) -> None:
        async with httpx.AsyncClient() as c:
            for name, (_, url) in self.sims.items():
                if name not in self.down:
                    await c.post(url + "/sim/control", json={"faults": faults})

    def close(self) -> None:
        self.sup.stop(self.gateway)
        for child, _ in self.sims.values():
            self.sup.stop(child)

    def signal(self, name: str, sig: signal.Signals) -> None:
        if sig == signal.SIGCONT:
            self.down.discard(name)
        else:
            self.down.add(name)
        os.killpg(self.sims[name][0].popen.pid, sig)


def _chat(rng: random.Random, stream: bool, route: str = CHAT) -> dict[str, Any]:
    """A request of ``route``'s shape."""
    words = " ".join(rng.choice(["json", "code", "story", "list", "why"]) for _ in range(8))
    most = rng.randint(4, 24)
    asked: dict[str, Any] = {"prompt": words, "max_tokens": most}
    if route in (CHAT, MESSAGES):
        asked = {"messages": [{"role": "user", "content": words}], "max_tokens": most}
    elif route == RESPONSES:
        asked = {"input": words, "max_output_tokens": most}
    return {"model": MODEL, **asked, "temperature": rng.choice([0.0, 0.7, 1.0]), "stream": stream}


def error_shaped(route: str, body: Any) -> bool:
    """An error answer (or error event) in the shape of ``route``'s API: Anthropic's
    ``{"type": "error", "error": {"type", "message"}}`` on ``/v1/messages``, OpenAI's
    ``{"error": {"message", "type", ...}}`` elsewhere; on ``/v1/responses`` mid-stream, the
    Responses API's ``error`` event (``{"type": "error", "code", "message", ...}``)."""
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    if route == MESSAGES:
        return (
            body.get("type") == "error"
            and isinstance(error, dict)
            and isinstance(error.get("type"), str)
            and isinstance(error.get("message"), str)
        )
    if route == RESPONSES and body.get("type") == "error":
        return isinstance(body.get("message"), str) and "code" in body
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
    )


def sse_events(data: bytes) -> list[tuple[str | None, Any]]:
    """A stream's events: each one's ``event:`` name (or None) and its JSON data (the
    bytes, where they are no JSON)."""
    events: list[tuple[str | None, Any]] = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, raw = None, b""
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode(errors="replace")
            elif line.startswith(b"data:"):
                raw += line[5:].strip()
        if name is None and not raw:
            continue
        try:
            events.append((name, json.loads(raw)))
        except ValueError:
            events.append((name, raw))
    return events


def stream_end(route: str, data: bytes) -> str:
    """How a 200 stream of ``route`` ended: ``"done"`` (its API's last event; chat and
    completions: ``[DONE]``), ``"error"`` (an error event in its API's shape, or a Responses
    ``response.failed``), ``"misshapen"`` (an error event in another shape) or
    ``"truncated"`` (neither: silently cut)."""
    if route not in _LAST and data.rstrip().endswith(b"data: [DONE]"):
        return "done"
    events = [e for e in sse_events(data) if e[1] != b"[DONE]"]
    name, last = events[-1] if events else (None, None)
    kind = last.get("type") if isinstance(last, dict) else None
    if route in _LAST and kind in _LAST[route]:
        return "done"
    if route == RESPONSES and kind == "response.failed":
        return "error"
    if name == "error" or kind == "error" or (isinstance(last, dict) and "error" in last):
        named = route not in _LAST or name == "error"  # Messages' and Responses' are named
        return "error" if named and error_shaped(route, last) else "misshapen"
    return "truncated"


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def _one(
    c: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    tally: Tally,
    route: str = CHAT,
) -> None:
    failed = True
    try:
        async with c.stream("POST", url + route, json=body) as r:
            data = b"".join([chunk async for chunk in r.aiter_bytes()])
        tally.count(r.status_code)
        if r.status_code != 200:
            if r.status_code in (429, 503) and "retry-after" not in r.headers:
                tally.no_retry_after += 1
            if not error_shaped(route, _json(data)):
                tally.misshapen += 1
        elif not body.get("stream"):
            failed = False
        elif (end := stream_end(route, data)) == "truncated":
            tally.truncated += 1
        elif end != "done":
            tally.count(-1)  # an honest error event: a client error, not silent
            tally.statuses[200] -= 1
            tally.misshapen += end == "misshapen"
        else:
            failed = False
    except httpx.HTTPError:
        tally.transport += 1
    if failed:
        tally.by_route[route] = tally.by_route.get(route, 0) + 1


async def load(
    url: str, requests: int, concurrency: int, seed: int, tally: Tally | None = None
) -> Tally:
    tally = tally or Tally()
    rng = random.Random(seed)
    left = iter(range(requests))

    async def worker() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            for i in left:
                route = ROUTES[i // 2 % len(ROUTES)]
                await _one(c, url, _chat(rng, i % 2 == 0, route), tally, route)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


async def matrix(stack: Stack, n: int) -> list[Row]:
    rows = []

    async def scenario(
        name: str, expected: str, judge: Callable[[Tally], bool], setup: Awaitable[None] | None
    ) -> Tally:
        if setup is not None:
            await setup
        tally = await load(stack.url, n, 16, seed=len(rows))
        ok = judge(tally) and tally.misshapen == 0
        rows.append(Row(name, tally.requests, tally.errors, expected, ok, _note(tally)))
        await stack.control(HEALTHY)
        await settle(stack.url)
        return tally

    await scenario("healthy", "0", lambda t: t.errors == 0, None)
    await scenario(
        "30% independent errors on every endpoint",
        "<= 5%",
        lambda t: t.errors <= 0.05 * t.requests,
        stack.control({"error_rate": 0.3}),
    )
    await scenario(
        "20% of answers dropped mid-stream",
        "non-streaming 0; no silent truncation",
        lambda t: t.truncated == 0 and t.errors == t.statuses.get(-1, 0),
        stack.control({"die_rate": 0.2, "die_after_chunks": 2}),
    )
    await scenario(
        "every endpoint overloaded (503)",
        "all 503 with Retry-After; 0 of 500",
        lambda t: set(t.statuses) == {503} and t.no_retry_after == 0,
        stack.control({"overloaded": True}),
    )
    stack.signal("spec-0", signal.SIGSTOP)
    await scenario("one speculative endpoint SIGSTOPped", "0", lambda t: t.errors == 0, None)
    stack.signal("spec-0", signal.SIGCONT)
    stack.signal("spec-1", signal.SIGKILL)
    await asyncio.sleep(0.5)
    await scenario("one speculative endpoint SIGKILLed", "0", lambda t: t.errors == 0, None)
    rows += await hostile(stack.url, n)
    return rows


async def settle(url: str, timeout_s: float = 120.0) -> None:
    """Wait until the gateway has answered 20 requests in a row with 200 (ejected endpoints
    back), so that one scenario's faults do not count against the next."""
    deadline = time.monotonic() + timeout_s
    rng = random.Random(0)
    async with httpx.AsyncClient(timeout=30) as c:
        run = 0
        while run < 20 and time.monotonic() < deadline:
            r = await c.post(url + "/v1/chat/completions", json=_chat(rng, stream=False))
            run = run + 1 if r.status_code == 200 else 0
            if run == 0:
                await asyncio.sleep(0.5)


async def hostile(url: str, n: int) -> list[Row]:
    """Normal clients beside 300 slowloris connections, then beside a header flood."""
    host, port = url.removeprefix("http://").split(":")
    rows = []
    for name, attack in (("slowloris, 300 connections", _slow), ("header flood", _flood)):
        stop = asyncio.Event()
        attackers = [asyncio.create_task(attack(host, int(port), stop)) for _ in range(300)]
        tally = await load(url, n, 16, seed=7)
        stop.set()
        await asyncio.gather(*attackers, return_exceptions=True)
        ok = tally.errors == 0 and tally.misshapen == 0
        scenario = f"normal clients during a {name}"
        rows.append(Row(scenario, tally.requests, tally.errors, "0", ok, _note(tally)))
    return rows


async def _slow(host: str, port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            while not stop.is_set() and not reader.at_eof():
                with contextlib.suppress(OSError):
                    writer.write(b"x")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1024), 1.0)
            writer.close()


async def _flood(host: str, port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET / HTTP/1.1\r\nx: " + b"a" * (1 << 20))
            with contextlib.suppress(OSError):
                await writer.drain()
                await reader.read()
            writer.close()
        await asyncio.sleep(0.05)


# mode: what a client may get with the hostile endpoint as its ladder's only rung, and with
# a healthy rung below it (-1: a stream that ended in an SSE error event). Alone, a 503 is a
# whole answer given up when its endpoint was ejected meanwhile (or, for "short", a whole
# answer whose retries broke too); below, a 200 for "endless" comes once it is ejected. A
# 504 for "huge" alone is a stream whose first event did not come within first_byte_s.
HOSTILE: dict[str, tuple[set[int], set[int]]] = {
    "html": ({502, 503}, {200}),
    "sse-text": ({502, 503}, {200}),
    "endless": ({503, 504, -1}, {504, -1, 200}),
    "huge": ({502, 503, 504}, {200}),
    "short": ({502, 503, 504, -1}, {200, -1}),
    "http10": ({200}, {200}),
    "big-event": ({200}, {200}),
    "429": ({429}, {200}),
}
HOSTILE_TOTAL_S = 8.0


def _hostile_policy(hostile: str, sim: str) -> str:
    """One ladder of the hostile endpoint alone and one with a healthy rung below it per
    mode; normal traffic on its own ladder. Whole answers pass through on every pool."""
    timeouts = f"{{connect_s: 1, first_byte_s: 4, idle_s: 3, total_s: {HOSTILE_TOTAL_S}}}"
    pools = [f"  good: {{kind: standard, model: {MODEL}, endpoints: [{sim}]}}"]
    ladders = [f"  {MODEL}: [good]"]
    rules = []
    spec = "num_speculative_tokens: 4"
    for mode in HOSTILE:
        bad = (
            f"endpoints: [{hostile}/{mode}], timeouts: {timeouts}, passthrough_non_streaming: true"
        )
        pools += [
            f"  bad-{mode}: {{kind: speculative, model: fb-{mode}, {spec}, {bad}}}",
            f"  fb-{mode}: {{kind: standard, model: fb-{mode}, endpoints: [{sim}]}}",
            f"  alone-{mode}: {{kind: standard, model: alone-{mode}, {bad}}}",
        ]  # fmt: skip
        ladders += [f"  fb-{mode}: [bad-{mode}, fb-{mode}]", f"  alone-{mode}: [alone-{mode}]"]
        rules.append(f"  - {{name: fb-{mode}, match: {{model: [fb-{mode}]}}, start: bad-{mode}}}")
    return "\n".join(
        ["version: 1", "pools:", *pools, "ladders:", *ladders, "rules:", *rules,
         "  - {name: default, start: standard}"]
    )  # fmt: skip


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        / 1024
    )


def _watch(pid: int, url: str, stop: threading.Event) -> tuple[float, float]:
    """The gateway's peak RSS (MiB) and its slowest ``/healthz`` (s) until ``stop``: in a
    thread of its own with blocking calls, so that the load's event loop does not delay it."""
    peak = lag = 0.0
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            peak = max(peak, _rss_mib(pid))
            start = time.monotonic()
            c.get(url + "/healthz")
            lag = max(lag, time.monotonic() - start)
            stop.wait(0.1)
    return peak, lag


async def _hostile_row(url: str, pid: int, mode: str, alone: bool, n: int) -> Row:
    model = f"{'alone' if alone else 'fb'}-{mode}"
    expected = HOSTILE[mode][0 if alone else 1]
    tally, normal, slowest = Tally(), Tally(), [0.0]
    rng = random.Random(5)
    left = iter(range(n))
    stop = asyncio.Event()

    async def worker() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            for i in left:
                route = ROUTES[i // 2 % len(ROUTES)]
                body = _chat(rng, i % 2 == 0, route) | {"model": model}
                start = time.monotonic()
                await _one(c, url, body, tally, route)
                slowest[0] = max(slowest[0], time.monotonic() - start)

    async def other() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            while not stop.is_set():
                route = rng.choice(ROUTES)
                await _one(c, url, _chat(rng, rng.random() < 0.5, route), normal, route)

    before = _rss_mib(pid)
    halt = threading.Event()
    watch = asyncio.create_task(asyncio.to_thread(_watch, pid, url, halt))
    others = [asyncio.create_task(other()) for _ in range(4)]
    await asyncio.gather(*(worker() for _ in range(8)))
    stop.set()
    halt.set()
    await asyncio.gather(*others)
    peak, lag = await watch
    got = {status for status, count in tally.statuses.items() if count}
    ok = (
        got <= expected
        and tally.truncated == 0
        and tally.transport == 0
        and tally.misshapen == 0
        and normal.errors == 0
        and slowest[0] <= HOSTILE_TOTAL_S + 2
    )
    note = (
        f"{_note(tally)}; slowest {slowest[0]:.1f} s; RSS {before:.0f} -> peak {peak:.0f} MiB; "
        f"slowest /healthz {lag * 1000:.0f} ms; other traffic {normal.errors}/{normal.requests} "
        "errors"
    )
    where = "alone" if alone else "with a healthy rung below"
    shown = ", ".join("SSE error event" if s == -1 else str(s) for s in sorted(expected))
    return Row(f"hostile upstream: {mode}, {where}", tally.requests, tally.errors,
               f"{shown}; total <= total_s ({HOSTILE_TOTAL_S:.0f} s)", ok, note)  # fmt: skip


async def hostile_upstreams(sup: Supervisor, tmp: Path, n: int) -> list[Row]:
    """Each mode of ``bench/hostile.py`` alone and above a healthy rung, beside normal
    traffic, through one gateway in front of the hostile server and one simulator."""
    port = free_port()
    hostile = sup.start("hostile", [sys.executable, "-m", "bench.hostile", "--port", str(port)])
    hostile_url = f"http://127.0.0.1:{port}"
    sup.wait_ready(hostile, hostile_url + "/v1/models")
    port = free_port()
    argv = [sys.executable, "-m", "gateway", "sim", "--mode", "standard", "--port", str(port)]
    argv += ["--time-scale", "0.01", "--model", MODEL]
    for mode in HOSTILE:
        argv += ["--model", f"fb-{mode}"]
    sim = sup.start("sim-hostile", argv)
    sim_url = f"http://127.0.0.1:{port}"
    sup.wait_ready(sim, sim_url + "/v1/models")
    policy = tmp / "hostile-policy.yaml"
    policy.write_text(_hostile_policy(hostile_url, sim_url))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    env |= {"SPECLANE_POLICY": str(policy), "SPECLANE_PORT": str(port),
            "SPECLANE_LOG_LEVEL": "error", "SPECLANE_DRAIN_DELAY_S": "0"}  # fmt: skip
    gateway = sup.start("gateway-hostile", [sys.executable, "-m", "gateway", "serve"], env)
    sup.wait_ready(gateway, url + "/healthz")
    rows = []
    try:
        for mode in HOSTILE:
            for alone in (True, False):
                rows.append(await _hostile_row(url, gateway.popen.pid, mode, alone, n))
    finally:
        for child in (gateway, sim, hostile):
            sup.stop(child)
    return rows


# the fields each route's fuzzed bodies set to odd values, beside their usual ones
_FUZZED_KEYS = {
    CHAT: ["model", "messages", "temperature", "top_p", "max_tokens", "stream", "n", "tools",
           "response_format", "stream_options", "user", "logprobs", "stop", "seed", "zz"],
    COMPLETIONS: ["model", "prompt", "max_tokens", "stream", "n", "echo", "logprobs", "stop",
                  "suffix", "best_of", "stream_options", "zz"],
    MESSAGES: ["model", "messages", "max_tokens", "system", "stream", "temperature", "top_k",
               "top_p", "stop_sequences", "tools", "tool_choice", "metadata", "thinking", "zz"],
    RESPONSES: ["model", "input", "instructions", "max_output_tokens", "stream", "tools",
                "tool_choice", "text", "reasoning", "previous_response_id", "store", "user",
                "temperature", "include", "zz"],
}  # fmt: skip
_ODD_CONTENT = [
    {"type": "text"}, {"type": "image", "source": {}}, {"type": "tool_result"},
    {"type": "input_text", "text": 3}, {"type": "function_call_output", "output": None},
    {"role": "assistant", "content": [{"type": "tool_use", "id": 1, "input": "x"}]},
]  # fmt: skip


# a conversation in each API's own blocks and items, for the fuzz to spoil one value deep in
_RICH: dict[str, dict[str, Any]] = {
    CHAT: {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]},
    ]},
    MESSAGES: {"system": [{"type": "text", "text": "Be brief.", "cache_control": {}}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "k"}]},
    ]},
    RESPONSES: {"instructions": "Be brief.", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]},
}  # fmt: skip


def _spoil_deep(rng: random.Random, body: dict[str, Any], values: list[Any]) -> None:
    """Replace one value of ``body``, any value at any depth with even odds: a block's
    ``type``, a tool call's arguments, an item's role."""
    places: list[tuple[Any, Any]] = []
    stack: list[Any] = [body]
    while stack:
        node = stack.pop()
        pairs = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in pairs:
            places.append((node, key))
            if isinstance(child, dict | list):
                stack.append(child)
    if places:
        node, key = rng.choice(places)
        node[key] = copy.deepcopy(rng.choice(values))


def fuzz_request(rng: random.Random) -> tuple[str, str, dict[str, bytes], bytes]:
    values: list[Any] = [
        None, True, -1, 0, 1e308, "x" * rng.randint(0, 5000), [], {}, "\u0000", "\ud7ff",
        [[[[[]]]]], {"a": {"b": {}}}, 2**70, -0.0, "NaN", rng.choice(_ODD_CONTENT),
        [rng.choice(_ODD_CONTENT)],
    ]  # fmt: skip
    method = rng.choice(["POST"] * 8 + ["GET", "PUT"])
    path = rng.choice(
        [CHAT] * 3 + [MESSAGES] * 2 + [RESPONSES] * 2 + list(ROUTES)
        + ["/v1/models", "/admin/audit?limit=abc", "/%ff"]
    )  # fmt: skip
    route = path if path in ROUTES else CHAT
    body: dict[str, Any] = _chat(rng, rng.random() < 0.3, route)
    for _ in range(rng.randint(1, 4)):
        body[rng.choice(_FUZZED_KEYS[route])] = copy.deepcopy(rng.choice(values))
    if route in _RICH and rng.random() < 0.3:
        body |= copy.deepcopy(_RICH[route])
        _spoil_deep(rng, body, values)
    turns = body.get("messages", body.get("input"))
    if rng.random() < 0.3 and isinstance(turns, list):
        turns[:] = [
            {
                "role": rng.choice(["user", "tool", "x", 3]),
                "content": copy.deepcopy(rng.choice(values)),
            }
        ]
    raw = json.dumps(body).encode()
    shape = rng.random()
    if shape < 0.1:
        raw = raw[: rng.randint(0, len(raw))]
    elif shape < 0.15:
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
    elif shape < 0.2:
        depth = rng.randint(100, 3000)
        raw = b'{"model": "%s", "messages": [], "x": ' % MODEL.encode()
        raw += b"[" * depth + b"]" * depth + b"}"
    # mostly JSON, so that the body is read (another content type is a 415 before it is)
    kind = rng.choices(["application/json", "", "text/plain", "x/\u00e9"], [16, 2, 1, 1])[0]
    headers = {"content-type": kind} if kind else {}
    if rng.random() < 0.2:
        headers["x-request-id"] = rng.choice(["ok-1", "a b", "x" * 500, "\u00ff"])
    if rng.random() < 0.3:
        headers["x-api-key"] = rng.choice(["", "sk-ant-x", "k" * 5000, "\u00ff\u00fe", "a,b"])
    if rng.random() < 0.3:
        headers["anthropic-version"] = rng.choice(
            ["2023-06-01", "", "1999-01-01", "x" * 3000, "\u00e9"]
        )
    if rng.random() < 0.1:
        headers["anthropic-beta"] = rng.choice(["tools-2024-04-04", ",,,", "\u00ff"])
    encoded = {k: v.encode() for k, v in headers.items()}  # UTF-8 bytes, not ASCII
    return method, path, encoded, raw


async def fuzz(url: str, count: int) -> Row:
    """``count`` fuzzed requests: no 5xx, and every 4xx a POST to a model route gets in the
    shape of that route's API (404 and 405 of routing are vLLM's own ``{"detail": ...}``)."""
    rng = random.Random(9)
    requests = [fuzz_request(rng) for _ in range(count)]
    tally = Tally()
    bad: list[str] = []
    routes: dict[str, int] = {}
    left = iter(requests)

    async def worker() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            for method, path, headers, raw in left:
                try:
                    r = await c.request(method, url + path, headers=headers, content=raw)
                    await r.aread()
                except httpx.HTTPError:
                    tally.transport += 1
                    continue
                tally.count(r.status_code)
                routes[path] = routes.get(path, 0) + 1
                shaped = r.status_code < 400 or r.status_code >= 500 or method != "POST"
                if path in ROUTES and not shaped and not error_shaped(path, _json(r.content)):
                    tally.misshapen += 1
                    if len(bad) < 5:
                        bad.append(f"{r.status_code} {path} {r.content[:120]!r}")
                if r.status_code >= 500 and len(bad) < 5:
                    bad.append(f"{r.status_code} {path} {raw[:80]!r}")

    await asyncio.gather(*(worker() for _ in range(16)))
    five = sum(v for k, v in tally.statuses.items() if k >= 500) + tally.transport
    note = ", ".join(f"{k}: {v}" for k, v in sorted(tally.statuses.items()))
    note += "; " + ", ".join(f"{p} {routes.get(p, 0)}" for p in ROUTES)
    if tally.misshapen:
        note += f"; 4xx not in the route's shape: {tally.misshapen}"
    if bad:
        note += "; first failures: " + " | ".join(bad)
    return Row("fuzzed requests (bodies, headers, methods, paths; every model route)",
               tally.requests, five + tally.misshapen, "0 5xx; every 4xx in its API's shape",
               five == 0 and tally.misshapen == 0, note)  # fmt: skip


def _sample(pid: int, url: str) -> tuple[float, int, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    metrics = httpx.get(url + "/metrics").text
    tasks = next(
        float(line.split()[-1]) for line in metrics.splitlines()
        if line.startswith("speclane_event_loop_tasks ")
    )  # fmt: skip
    return rss / 1024, fds, tasks


async def soak(stack: Stack, seconds: float, concurrency: int) -> tuple[Row, list[str]]:
    pid = stack.gateway.popen.pid
    tally = Tally()
    samples: list[tuple[float, float, int, float]] = []
    stop = time.monotonic() + seconds
    rng = random.Random(3)

    async def worker() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            while time.monotonic() < stop:
                route = rng.choice(ROUTES)
                await _one(c, stack.url, _chat(rng, rng.random() < 0.5, route), tally, route)

    async def sampler() -> None:
        start = time.monotonic()
        while time.monotonic() < stop:
            rss, fds, tasks = await asyncio.to_thread(_sample, pid, stack.url)
            samples.append((time.monotonic() - start, rss, fds, tasks))
            await asyncio.sleep(max(1.0, seconds / 20))

    await asyncio.gather(sampler(), *(worker() for _ in range(concurrency)))
    warm = [s for s in samples if s[0] >= seconds / 5] or samples
    grown = warm[-1][1] - warm[0][1]
    lines = [f"| {t:.0f} | {rss:.1f} | {fds} | {tasks:.0f} |" for t, rss, fds, tasks in samples]
    ok = tally.errors == 0 and grown < 20
    note = (
        f"{tally.requests / seconds:.0f} req/s; RSS {warm[0][1]:.1f} -> {warm[-1][1]:.1f} MiB "
        f"after warm-up (+{grown:.1f}); fds {min(s[2] for s in warm)}-{max(s[2] for s in warm)}; "
        f"tasks {min(s[3] for s in warm):.0f}-{max(s[3] for s in warm):.0f}"
    )
    row = Row(f"soak, concurrency {concurrency}, {seconds:.0f} s", tally.requests, tally.errors,
              "0; RSS +<20 MiB after warm-up; fds, tasks flat", ok, note)  # fmt: skip
    return row, lines


def _note(tally: Tally) -> str:
    parts = [
        f"{k if k != -1 else 'SSE error event'}: {v}" for k, v in sorted(tally.statuses.items())
    ]
    if tally.truncated:
        parts.append(f"silently truncated: {tally.truncated}")
    if tally.misshapen:
        parts.append(f"errors not in the route's shape: {tally.misshapen}")
    if tally.by_route:
        routes = ", ".join(f"{r} {n}" for r, n in sorted(tally.by_route.items()))
        parts.append(f"client errors by route: {routes}")
    if tally.transport:
        parts.append(f"transport errors: {tally.transport}")
    return ", ".join(parts)


def _phase(scenario: str) -> str:
    """The phase of ``main``'s that wrote a row of the table."""
    for prefix, phase in (("hostile upstream", "hostile"), ("fuzzed", "fuzz"), ("soak", "soak")):
        if scenario.startswith(prefix):
            return phase
    return "matrix"


def _earlier(section: str) -> tuple[list[str], dict[str, str], list[str]]:
    """An earlier table's rows, each phase's command, and its soak samples."""
    lines = section.splitlines()
    cells = [ln for ln in lines if ln.startswith("| ") and not ln.startswith(("| -", "| s |"))]
    rows = [ln for ln in cells if ln.count("|") == 7 and not ln.startswith("| scenario")]
    soak = [ln for ln in cells if ln.count("|") == 5]
    commands: dict[str, str] = {}
    for line in lines:
        if line.startswith("- ") and ": `" in line:  # "- matrix, soak: `command`"
            phases, _, rest = line[2:].partition(": `")
            for phase in phases.split(", "):
                commands[phase] = rest.split("`")[0]
        elif line.startswith("`python -m bench.faults"):  # one command for every row
            commands = dict.fromkeys(("matrix", "hostile", "fuzz", "soak"), line.split("`")[1])
    return rows, commands, soak


def write(rows: list[Row], soak_lines: list[str], command: str, phases: list[str]) -> None:
    """Replace the rows of ``phases`` in the table, keeping the other phases' rows (and the
    soak's samples) from the runs that wrote them."""
    text = RESULTS.read_text()
    start = text.find(HEADING)
    end = text.find("\n## ", start + len(HEADING)) if start >= 0 else -1
    section = text[start : end if end >= 0 else len(text)] if start >= 0 else ""
    kept, commands, samples = _earlier(section)
    kept = [ln for ln in kept if _phase(ln.split("|")[1].strip()) not in phases]
    commands |= dict.fromkeys(phases, command)
    samples = soak_lines or ([] if "soak" in phases else samples)
    order = {"matrix": 0, "hostile": 1, "fuzz": 2, "soak": 3}
    new = [
        f"| {r.scenario} | {r.requests} | {r.errors} | {r.expected} | "
        f"{'pass' if r.verdict else 'FAIL'} | {r.note} |"
        for r in rows
    ]
    table_rows = sorted(kept + new, key=lambda ln: order[_phase(ln.split("|")[1].strip())])
    by_command: dict[str, list[str]] = {}
    for phase in sorted(commands, key=order.__getitem__):
        by_command.setdefault(commands[phase], []).append(phase)
    table = [
        HEADING,
        "",
        "Each phase's rows come from its last run (2 shared cores; simulators at",
        "`--time-scale 0.01`, ~half streaming; the routes of `ROUTES` at the time):",
        "",
        *(f"- {', '.join(p)}: `{c}`" for c, p in by_command.items()),
        "",
        "Client errors: any answer but 200, streams ending in an error event, silently",
        "truncated streams, errors not in the shape of their route's API and transport errors",
        "(for the fuzz row: 5xx, transport errors and 4xx not in their route's shape).",
        "",
        "| scenario | requests | client errors | expected | verdict | detail |",
        "| --- | ---: | ---: | --- | --- | --- |",
        *table_rows,
    ]
    if samples:
        table += ["", "Soak samples of the gateway process:", "",
                  "| s | RSS MiB | fds | event-loop tasks |", "| ---: | ---: | ---: | ---: |",
                  *samples]  # fmt: skip
    after = text[end + 1 :] if start >= 0 and end >= 0 else ""
    before = text[:start] if start >= 0 else text
    RESULTS.write_text(
        before.rstrip("\n") + "\n\n" + "\n".join(table) + "\n" + ("\n" + after if after else "")
    )


async def main_async(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    soak_lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, Supervisor(Path(tmp)) as sup:
        for phase in args.only:
            if phase == "hostile":
                rows += await hostile_upstreams(sup, Path(tmp), args.hostile_requests)
                continue
            stack = Stack(sup, Path(tmp))
            if phase == "fuzz":
                rows.append(await fuzz(stack.url, args.fuzz))
            elif phase == "soak":
                row, soak_lines = await soak(stack, args.soak_s, args.concurrency)
                rows.append(row)
            else:
                rows += await matrix(stack, args.requests)
            stack.close()
    command = "python -m bench.faults " + " ".join(sys.argv[1:])
    write(rows, soak_lines, command.strip(), args.only)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak-s", type=float, default=600.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--fuzz", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=400, help="per matrix scenario")
    parser.add_argument(
        "--hostile-requests", type=int, default=32, help="per hostile upstream and ladder"
    )
    phases = ["matrix", "hostile", "fuzz", "soak"]
    parser.add_argument("--only", nargs="+", choices=phases, default=phases)
    rows = asyncio.run(main_async(parser.parse_args()))
    for r in rows:
        print(f"{'pass' if r.verdict else 'FAIL'}  {r.scenario}: {r.errors}/{r.requests}  {r.note}")
    sys.exit(0 if all(r.verdict for r in rows) else 1)


if __name__ == "__main__":
    main()
