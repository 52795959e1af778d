"""Build a gateway for tests: a policy file in a temp dir, settings, and a served app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.server.app import build_services, create_app
from gateway.server.connections import server_options
from gateway.services import Services
from gateway.settings import Settings
from tests.servers import serving

DEFAULT_RULES = """
rules:
  - name: default
    start: spec
"""


def policy_yaml(
    spec: Sequence[str],
    standard: Sequence[str],
    *,
    model: str = "tiny",
    k: int = 4,
    rules: str = DEFAULT_RULES,
    extra: str = "",
) -> str:
    return f"""
version: 1
pools:
  spec:
    kind: speculative
    model: {model}
    num_speculative_tokens: {k}
    endpoints: [{", ".join(spec)}]
    timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 5}}
  standard:
    kind: standard
    model: {model}
    endpoints: [{", ".join(standard)}]
    timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 5}}
ladder: [spec, standard]
{extra}
{rules}
"""


def sim_policy(*, spec: str = "", standard: str = "", start: str = "spec") -> str:
    """The usual two-pool policy in front of ``sim_stack``'s simulators (model qwen3-32b),
    ``{spec}`` and ``{std}`` left for it to fill; ``spec`` and ``standard`` add keys to a
    pool (``"passthrough_non_streaming: false"``)."""
    escaped = {
        name: keys.replace("{", "{{").replace("}", "}}")
        for name, keys in (("s", spec), ("t", standard))
    }
    extra = {name: f", {keys}" if keys else "" for name, keys in escaped.items()}
    return f"""
version: 1
pools:
  spec: {{{{kind: speculative, model: qwen3-32b, num_speculative_tokens: 4,
          endpoints: ["{{spec}}"]{extra["s"]}}}}}
  standard: {{{{kind: standard, model: qwen3-32b, endpoints: ["{{std}}"]{extra["t"]}}}}}
ladder: [spec, standard]
rules: [{{{{name: default, start: {start}}}}}]
"""


def settings(tmp: Path, text: str, **overrides: Any) -> Settings:
    path = tmp / "policy.yaml"
    path.write_text(text)
    return Settings(policy=path, **overrides)


@asynccontextmanager
async def gateway(settings_: Settings) -> AsyncIterator[tuple[str, Services]]:
    """A gateway served by uvicorn on loopback; yields its URL and its services."""
    services = build_services(settings_)
    async with serving(create_app(settings_, services), **server_options(settings_)) as url:
        yield url, services


@asynccontextmanager
async def fake_stack(
    tmp: Path, spec_app: Any, standard_app: Any, text: str | None = None, **overrides: Any
) -> AsyncIterator[tuple[str, Services]]:
    """Gateway + two upstream apps (speculative, standard), all on loopback."""
    async with serving(spec_app) as spec_url, serving(standard_app) as std_url:
        policy = text.format(spec=spec_url, std=std_url) if text else None
        body = policy or policy_yaml([spec_url], [std_url])
        async with gateway(settings(tmp, body, **overrides)) as running:
            yield running


class Stack(NamedTuple):
    url: str
    services: Services
    spec: str  # the speculative simulator, for /sim/control


@asynccontextmanager
async def sim_stack(
    tmp: Path, policy: str, spec: SimConfig, **overrides: Any
) -> AsyncIterator[Stack]:
    """Gateway in front of a speculative simulator (``spec``) and a standard one at the same
    time scale; ``policy`` names them ``{spec}`` and ``{std}``."""
    standard = SimConfig(
        mode=Mode.STANDARD, time_scale=spec.time_scale, served_model_names=spec.served_model_names
    )
    async with serving(sim_app(spec)) as spec_url, serving(sim_app(standard)) as std_url:
        text = policy.format(spec=spec_url, std=std_url)
        async with gateway(settings(tmp, text, **overrides)) as (url, services):
            yield Stack(url, services, spec_url)


async def served_by(c: httpx.AsyncClient, url: str, body: dict[str, Any], **headers: str) -> str:
    """The pool that answered ``body`` (asserting the answer is a 200)."""
    response = await c.post(url + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.headers["x-speclane-pool"]
