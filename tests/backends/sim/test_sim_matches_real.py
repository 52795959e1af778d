"""The simulator's answers and ``/metrics`` have the shapes real vLLM's have.

``tests/vllm_fixtures/{standard,ngram,draft}/`` hold real vLLM 0.32 answers recorded by
``speclane local-vllm record`` (see the README there). The same requests go to a simulator
of the same kind, and every difference in field names, nesting, kinds of value, SSE chunk
sequence (role, content, finish, usage chunks), and metric names, types and labels is
reported. Values are never compared: the simulator's text and numbers are its own.

Each simulator is configured as its real server was started (``servers.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx
import orjson
import pytest

from backends.sim.config import Mode, SimConfig
from backends.sim.dialects import SimEngine
from backends.sim.model import Method
from gateway.cli.localvllm.record import requests
from tests.backends.sim.shapes import json_differences, metrics_differences, stream_differences

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parents[2] / "vllm_fixtures"
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
}
QUEUES = {"vllm:num_requests_running", "vllm:num_requests_waiting"}


def speculative(method: Method) -> SimConfig:
    """As ``local-vllm`` starts its speculative servers: k=4, per-request timings on."""
    return SimConfig(
        k=4,
        method=method,
        timing_metrics=True,
        served_model_names=("tiny",),
        time_scale=0.001,  # timings need time to pass: zero_latency would leave them null
    )


SIMS = {
    "standard": SimConfig(mode=Mode.STANDARD, served_model_names=("tiny",), zero_latency=True),
    "ngram": speculative(Method.NGRAM),
    "draft": speculative(Method.DRAFT_MODEL),
}

Serve = Callable[[SimConfig], AbstractAsyncContextManager[str]]


@pytest.mark.parametrize("server", sorted(SIMS))
async def test_simulator_answers_have_the_real_shapes(server: str, sim_server: Serve) -> None:
    problems: list[str] = []
    async with sim_server(SIMS[server]) as url, httpx.AsyncClient(timeout=30) as client:
        for name, (path, body) in requests("tiny").items():
            real = (FIXTURES / server / name).read_bytes()
            ours = (await client.post(url + path, json=body)).content
            if name.endswith(".sse"):
                found = stream_differences(real, ours)
            else:
                found = json_differences(orjson.loads(real), orjson.loads(ours))
            problems += [f"{name}: {d}" for d in found]
        sim_metrics = (await client.get(url + "/metrics")).text
    needed = QUEUES | (SPEC_COUNTERS if server != "standard" else set())
    real_metrics = (FIXTURES / server / "metrics.txt").read_text()
    problems += [
        f"metrics.txt: {d}" for d in metrics_differences(real_metrics, sim_metrics, needed)
    ]
    assert not problems, f"{server}: the simulator differs from vLLM:\n" + "\n".join(problems)


async def test_a_neuron_simulator_answers_as_vllm_does_without_per_request_flags(
    sim_server: Serve,
) -> None:
    """vLLM's Neuron plugin runs inside vLLM (0.11, with no per-request flags): its answers
    have the shapes of a vLLM server started without them (the standard fixtures), and its
    ``/metrics`` the speculative counters' series of the draft server, which it never counts
    up (``tests/backends/sim/test_sim_engines.py``). There is no real Neuron server here;
    this pins the simulator to the real vLLM it plays."""
    neuron = SimConfig(
        k=4, engine=SimEngine.VLLM_NEURON, served_model_names=("tiny",), zero_latency=True
    )
    problems: list[str] = []
    async with sim_server(neuron) as url, httpx.AsyncClient(timeout=30) as client:
        for name, (path, body) in requests("tiny").items():
            real = (FIXTURES / "standard" / name).read_bytes()
            ours = (await client.post(url + path, json=body)).content
            if name.endswith(".sse"):
                found = stream_differences(real, ours)
            else:
                found = json_differences(orjson.loads(real), orjson.loads(ours))
            problems += [f"{name}: {d}" for d in found]
        sim_metrics = (await client.get(url + "/metrics")).text
    real_metrics = (FIXTURES / "draft" / "metrics.txt").read_text()
    found = metrics_differences(real_metrics, sim_metrics, QUEUES | SPEC_COUNTERS)
    problems += [f"metrics.txt: {d}" for d in found]
    assert not problems, "vllm-neuron differs from vLLM:\n" + "\n".join(problems)


def test_the_differences_are_found() -> None:
    real = {"a": 1, "b": {"c": None}, "d": [{"e": "x"}]}
    sim = {"a": "1", "b": {}, "d": [{"e": "y", "f": 2}], "g": True}
    assert json_differences(real, sim) == [
        "$.a: real number, simulator str",
        "$.b.c: missing in the simulator",
        "$.d[0].f: only in the simulator",
        "$.g: only in the simulator",
    ]
    usage = b'data: {"choices": [], "usage": {}}\n\ndata: [DONE]\n\n'
    content = b'data: {"choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}]}\n\n'
    assert stream_differences(content + usage, content + b"data: [DONE]\n\n") == [
        "chunk sequence: real ['finish', 'usage', 'done'], simulator ['finish', 'done']"
    ]
    real_metrics = '# TYPE x_total counter\nx_total{a="1"} 1\n'
    sim_metrics = '# TYPE x_total counter\nx_total{b="1"} 1\n# TYPE y gauge\ny 1\n'
    assert metrics_differences(real_metrics, sim_metrics, {"x", "z"}) == [
        "x: real counter ['a'], simulator counter ['b']",
        "y: the simulator serves it, vLLM does not",
        "z: not served by vLLM",
        "z: vLLM serves it, the simulator does not",
    ]
