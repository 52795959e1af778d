"""The simulator's Messages and Responses answers have real vLLM 0.32's shapes: the requests
of ``agent_requests`` (``gateway/cli/localvllm/record.py``) go to a simulator of each kind,
and every difference in fields, nesting, kinds of value and sequence of named events from
the answers recorded in ``tests/vllm_fixtures/{standard,ngram,draft}/`` is reported.
Values are never compared: nor is how an answer ended, so a response's
``incomplete_details`` may be null where the recorded answer ran into ``max_output_tokens``
(the simulator's tool call closes its arguments sooner than the tiny model's did)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from gateway.cli.localvllm.record import agent_requests
from tests.backends.sim.shapes import json_differences, typed_differences
from tests.backends.sim.test_sim_matches_real import FIXTURES, SIMS, Serve

pytestmark = pytest.mark.anyio

_ENDED_SOONER = ".incomplete_details: real dict, simulator null"


@pytest.mark.parametrize("server", sorted(SIMS))
async def test_agent_api_answers_have_the_real_shapes(server: str, sim_server: Serve) -> None:
    problems: list[str] = []
    async with sim_server(SIMS[server]) as url, httpx.AsyncClient(timeout=30) as client:
        for name, (path, body) in agent_requests("tiny").items():
            real = (FIXTURES / server / name).read_bytes()
            ours = (await client.post(url + path, json=body)).content
            if name.endswith(".sse"):
                found = typed_differences(real, ours)
            else:
                found = json_differences(orjson.loads(real), orjson.loads(ours))
            problems += [f"{name}: {d}" for d in found if not d.endswith(_ENDED_SOONER)]
    assert not problems, f"{server}: the simulator differs from vLLM:\n" + "\n".join(problems)
