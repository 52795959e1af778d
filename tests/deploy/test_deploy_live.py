"""What deploy/ assumes about a running gateway, checked against one: the metric and label
names the Grafana dashboard queries, and the paths the Kubernetes probes ask.

The gateway runs on loopback in front of two simulated vLLM pools, with a Redis URL nobody
listens on (so the shared state is degraded and counts sync errors), and is driven through
one request of every kind a dashboard panel shows: served by speculation (acceptance,
TTFT, TPOT, a guardrail transition), failed over, mirrored in shadow, a structured answer,
one vLLM refuses, and a policy reload.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.services import Services
from tests.deploy import dashboard
from tests.deploy.kustomize_subset import render
from tests.gateways import gateway, policy_yaml, settings
from tests.servers import free_port, serving

pytestmark = pytest.mark.anyio

BASE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
TOKEN = "test-admin-token"
TARGET_LABELS = {"instance", "job"}  # Prometheus adds them to every scraped series
RULES = """
rules:
  - name: creative
    match: {temperature: {min: 0.9}}
    start: shadow
    shadow_fraction: 1.0
  - name: default
    start: spec
"""


@asynccontextmanager
async def running(tmp: Path) -> AsyncIterator[tuple[httpx.AsyncClient, str, Services]]:
    """A gateway in front of a speculative and a standard simulator; yields a client for
    it, the speculative simulator's URL and the gateway's services."""
    spec = SimConfig(mode=Mode.SPECULATIVE, served_model_names=("tiny",), time_scale=0.02)
    std = SimConfig(mode=Mode.STANDARD, served_model_names=("tiny",), time_scale=0.02)
    async with serving(sim_app(spec)) as spec_url, serving(sim_app(std)) as std_url:
        text = policy_yaml([spec_url], [std_url], rules=RULES).replace(
            "kind: standard", "kind: standard\n    cost_per_hour: 10"
        )
        configured = settings(
            tmp,
            text,
            redis_url=f"redis://127.0.0.1:{free_port()}/0",
            sync_interval_s=0.05,
            admin_token=TOKEN,
        )
        async with (
            gateway(configured) as (url, services),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            yield client, spec_url, services


async def chat(client: httpx.AsyncClient, temperature: float, status: int = 200, **more) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": temperature,
        "max_tokens": 24,
    }
    response = await client.post("/v1/chat/completions", json=body | more)
    assert response.status_code == status, response.text


async def drive(client: httpx.AsyncClient, spec: str, services: Services) -> None:
    """One request of every kind a dashboard panel shows."""
    await client.post(spec + "/sim/control", json={"faults": {"overloaded": True}})
    await chat(client, 0.2)  # speculation fails, standard serves: a failover
    await client.post(spec + "/sim/control", json={"faults": {"overloaded": False}})
    for _ in range(6):  # served by speculation; the pools learn their step times
        await chat(client, 0.2)
        await chat(client, 1.0)  # served by standard, mirrored to speculation
    await chat(client, 0.2, response_format={"type": "json_object"})
    await client.post(spec + "/sim/control", json={"faults": {"broken_structure": 1.0}})
    await chat(client, 0.2, response_format={"type": "json_object"}, max_tokens=400)  # no parse
    await client.post(spec + "/sim/control", json={"faults": {"die_rate": 1.0}})
    await chat(client, 0.2, stream=True)  # breaks after it started: an error outcome
    await client.post(spec + "/sim/control", json={"faults": {"die_rate": 0.0}})
    await chat(client, 0.2, 400, logprobs=True, top_logprobs=50)  # vLLM refuses it
    await chat(client, 0.2, 400, n="two")  # speclane refuses it
    (key,) = [k for k in services.stats.views.summary(time.time()) if k.startswith("default")]
    # the shadow canary's alarm moves the slice down: a guardrail transition
    services.stats.alarm(key, "canary: greedy output differs", {}, time.time())
    reload = await client.post("/admin/policy/reload", headers={"authorization": f"Bearer {TOKEN}"})
    assert reload.status_code == 200, reload.text
    assert services.stats.events, "no guardrail transition happened"
    while services.shadow.in_flight:
        await asyncio.sleep(0.01)


async def exposition(tmp: Path) -> tuple[dict[str, set[str]], str]:
    """Sample names on /metrics after one request of every kind, with their label names,
    and the exposition's text."""
    async with running(tmp) as (client, spec, services):
        await drive(client, spec, services)
        text = (await client.get("/metrics")).text
    labels: dict[str, set[str]] = defaultdict(set)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels[sample.name].update(sample.labels)
    return labels, text


async def test_the_dashboard_queries_only_metrics_and_labels_the_gateway_exposes(
    tmp_path: Path,
) -> None:
    exposed, _ = await exposition(tmp_path)
    for query in dashboard.queries(dashboard.load()):
        ours = {m for m in query.metrics if not m.startswith("vllm:")}
        missing = ours - set(exposed)
        assert not missing, f"{query.where}: {sorted(missing)} not on /metrics"
        if ours and ours == query.metrics:
            known = set().union(*(exposed[m] for m in ours)) | TARGET_LABELS
            assert query.labels <= known, f"{query.where}: labels {sorted(query.labels - known)}"


async def test_the_probe_paths_answer_on_a_running_gateway(tmp_path: Path) -> None:
    (deployment,) = [
        o for o in render(BASE) if o["kind"] == "Deployment" and o["metadata"]["name"] == "speclane"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    paths = {container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    paths.add(annotations["prometheus.io/path"])
    assert paths == {"/healthz", "/readyz", "/metrics"}
    async with running(tmp_path) as (client, _, _):
        for path in sorted(paths):
            response = await client.get(path)
            assert response.status_code == 200, f"{path}: {response.status_code}"
        detail = (await client.get("/readyz")).json()
        # The store is unreachable: readiness stays up (the gateway serves on local state)
        # and says so in the detail.
        assert detail["state"]["degraded"] is True
