"""The simulator's answers to a conversation's second turn have the shapes vLLM gives a
prompt that hit its prefix cache: ``prefix_requests`` (``gateway/cli/localvllm/record.py``)
go, in order, to a standard simulator started as ``local-vllm`` starts vLLM (with
``--enable-prompt-tokens-details``), and every difference in fields, nesting and kinds of
value from ``tests/vllm_fixtures/prefix/`` is reported, except the simulator's one addition:
``cache_read_input_tokens`` on Messages."""

from __future__ import annotations

from dataclasses import replace

import httpx
import orjson
import pytest

from gateway.cli.localvllm.record import prefix_requests
from tests.backends.sim.shapes import events, json_differences, typed_differences
from tests.backends.sim.test_sim_matches_real import FIXTURES, SIMS, Serve

pytestmark = pytest.mark.anyio

_ADDED = "$.usage.cache_read_input_tokens: only in the simulator"


def cached(name: str, raw: bytes) -> int:
    """The hits an answer reports, on whichever API it came from."""
    if name.endswith(".sse"):
        usage = next(e["usage"] for e in reversed(events(raw)) if isinstance(e, dict))
    else:
        usage = orjson.loads(raw)["usage"]
    if "input_tokens_details" in usage:
        return int(usage["input_tokens_details"]["cached_tokens"])
    if "input_tokens" in usage:
        return int(usage.get("cache_read_input_tokens") or 0)
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def test_second_turns_have_the_shapes_of_real_cache_hits(sim_server: Serve) -> None:
    config = replace(SIMS["standard"], enable_prompt_tokens_details=True)
    problems: list[str] = []
    hits: dict[str, int] = {}
    async with sim_server(config) as url, httpx.AsyncClient(timeout=30) as client:
        for name, (path, body) in prefix_requests("tiny").items():
            ours = (await client.post(url + path, json=body)).content
            if "turn2" in name and not name.startswith("prefix-messages-turn2-stream"):
                hits[name] = cached(name, ours)
            real_file = FIXTURES / "prefix" / name
            if not real_file.exists():
                continue
            real = real_file.read_bytes()
            if name.endswith(".sse"):
                found = typed_differences(real, ours)
            else:
                found = json_differences(orjson.loads(real), orjson.loads(ours))
            problems += [f"{name}: {d}" for d in found if d != _ADDED]
    assert not problems, "the simulator differs from vLLM:\n" + "\n".join(problems)
    assert hits and all(n > 0 for n in hits.values()), hits
