"""The simulator refuses what real vLLM 0.32 refuses, with the same status and the same
error body, byte for byte where vLLM writes it into a started stream; and its logprobs,
token ids, prompt logprobs, running usage and named tool calls have real vLLM's shapes.

``tests/vllm_fixtures/fields/`` holds real answers to the requests in ``requests.json`` and
``validation-errors.json`` (see the README there).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from backends.sim.config import SimConfig
from backends.sim.model import Method
from tests.backends.sim.shapes import json_differences, stream_differences

pytestmark = pytest.mark.anyio

FIELDS = Path(__file__).parents[2] / "vllm_fixtures" / "fields"
# as the real server was started: ngram k=4, timing metrics, a 2048-token context
SIM = SimConfig(
    k=4,
    method=Method.NGRAM,
    timing_metrics=True,
    served_model_names=("tiny",),
    max_model_len=2048,
    time_scale=0.001,
)
Serve = Callable[[SimConfig], AbstractAsyncContextManager[str]]


def load(name: str) -> dict[str, Any]:
    return orjson.loads((FIELDS / name).read_bytes())  # type: ignore[no-any-return]


async def test_the_same_requests_are_refused_with_the_same_words(sim_server: Serve) -> None:
    differ = []
    async with sim_server(SIM) as url, httpx.AsyncClient(base_url=url) as c:
        for name, case in load("validation-errors.json").items():
            answer = await c.post(case["path"], json=case["body"])
            if (answer.status_code, answer.json()) != (case["status"], case["answer"]):
                differ.append(f"{name}: real {case['answer']}, simulator {answer.text}")
    assert not differ, "\n".join(differ)


async def test_engine_errors_arrive_as_vllm_writes_them(sim_server: Serve) -> None:
    requests = load("requests.json")
    async with sim_server(SIM) as url, httpx.AsyncClient(base_url=url) as c:
        for name in (
            "error-in-stream-top-logprobs.sse",
            "error-top-logprobs.json",
            "error-in-stream-json-schema.sse",
            "error-json-schema.json",
        ):
            case = requests[name]
            answer = await c.post(case["path"], json=case["body"])
            real = (FIELDS / name).read_bytes()
            assert answer.status_code == case["status"], name
            if name.endswith(".sse"):
                assert answer.content == real, name
            else:
                assert answer.json() == orjson.loads(real), name


def by_rank(value: Any) -> Any:
    """A completion's ``top_logprobs`` maps token text to logprob: the tokens are data, not
    fields, so compare them as a list of logprobs."""
    if isinstance(value, dict):
        out = {k: by_rank(v) for k, v in value.items()}
        if "text_offset" in value and isinstance(value.get("top_logprobs"), list):
            out["top_logprobs"] = [list(t.values()) for t in value["top_logprobs"] if t]
        return out
    if isinstance(value, list):
        return [by_rank(v) for v in value]
    return value


def sse_by_rank(raw: bytes) -> bytes:
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    shown = [e if e == b"[DONE]" else orjson.dumps(by_rank(orjson.loads(e))) for e in events]
    return b"".join(b"data: " + e + b"\n\n" for e in shown)


async def test_extra_fields_have_the_real_shapes(sim_server: Serve) -> None:
    problems: list[str] = []
    async with sim_server(SIM) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        for name, case in load("requests.json").items():
            if name.startswith("error"):
                continue
            ours = (await c.post(case["path"], json=case["body"])).content
            real = (FIELDS / name).read_bytes()
            if name.endswith(".sse"):
                found = stream_differences(sse_by_rank(real), sse_by_rank(ours))
            else:
                found = json_differences(by_rank(orjson.loads(real)), by_rank(orjson.loads(ours)))
            problems += [f"{name}: {d}" for d in found]
    assert not problems, "the simulator differs from vLLM:\n" + "\n".join(problems)
