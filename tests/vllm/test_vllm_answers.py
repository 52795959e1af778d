"""The official ``openai`` client gets the same answers through speclane as directly from the
real vLLM server that speclane chose (greedy, so the text is comparable within one server).

What is compared is what holds on every call: the text, tool calls, finish reasons, usage and
vLLM's per-request acceptance figures, each chunk's fields, and errors' statuses and shapes.
Chunk boundaries are not compared: vLLM merges the deltas of engine steps its API process
has not yet sent, so on a busy machine the same request is cut into different chunks from
one call to the next, direct or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.cli.localvllm.record import TOOL
from gateway.cli.localvllm.stackfile import StackState, policy_text
from tests.vllm.serve import PINNED, Gateway, speclane_serve

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "class Parser:\n    def parse(self, text):\n"}]
# vLLM's per-request acceptance; its timings (and the per-step lists) vary between calls.
SPEC_FIELDS = (
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
)


@pytest.fixture(scope="module")
def gateway(stack_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    stack = StackState.load(stack_dir)
    assert stack is not None
    with speclane_serve(tmp_path_factory.mktemp("answers"), policy_text(stack) + PINNED) as running:
        yield running


def clients(stack: StackState, gateway: Gateway, server: str) -> tuple[Any, Any]:
    running = stack.server(server)
    assert running is not None
    direct = openai.OpenAI(base_url=running.url + "/v1", api_key="sk-test", max_retries=0)
    return direct, gateway.client(**{"x-speclane-endpoint": server})


def spec(body: dict[str, Any]) -> dict[str, Any] | None:
    figures = (body.get("metrics") or {}).get("speculative_decoding")
    return {k: figures[k] for k in SPEC_FIELDS} if figures else None


def whole(body: dict[str, Any]) -> dict[str, Any]:
    """What a non-streaming answer says, besides its id, creation time and timings."""
    choice = body["choices"][0]
    return {
        "object": body["object"],
        "model": body["model"],
        "text": choice["message"]["content"] if "message" in choice else choice["text"],
        "finish_reason": choice["finish_reason"],
        "usage": body["usage"],
        "speculative_decoding": spec(body),
    }


def streamed(stream: Any) -> dict[str, Any]:
    """What a stream says: its text, finish reason, each chunk's fields, the usage chunk."""
    chunks = [chunk.model_dump() for chunk in stream]
    text, finish, fields, tools = [], None, set(), []
    for chunk in chunks:
        fields.add(tuple(sorted(k for k in chunk if k not in {"system_fingerprint"})))
        for choice in chunk["choices"]:
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or choice.get("text") or "")
            for call in delta.get("tool_calls") or []:
                function = call["function"]
                tools.append((call["index"], function.get("name"), function.get("arguments")))
            finish = choice["finish_reason"] or finish
    usage = chunks[-1] if not chunks[-1]["choices"] else None
    return {
        "text": "".join(text),
        "tool_calls": _joined(tools),
        "finish_reason": finish,
        "fields": fields,
        "usage": usage and usage["usage"],
        "speculative_decoding": usage and spec(usage),
    }


def _joined(parts: list[tuple[int, str | None, str | None]]) -> dict[int, tuple[str, str]]:
    calls: dict[int, tuple[str, str]] = {}
    for index, name, arguments in parts:
        known_name, known_args = calls.get(index, ("", ""))
        calls[index] = (known_name + (name or ""), known_args + (arguments or ""))
    return calls


@pytest.mark.parametrize("server", ["standard", "ngram", "draft"])
def test_whole_answers(stack, gateway, server):
    direct, via = clients(stack, gateway, server)
    request = {"model": stack.model, "messages": MESSAGES, "temperature": 0, "max_tokens": 24}
    raw = via.chat.completions.with_raw_response.create(**request)
    assert raw.headers["x-speclane-pool"] == server
    ours = whole(raw.parse().model_dump())
    assert ours == whole(direct.chat.completions.create(**request).model_dump())
    assert ours["text"] and (ours["speculative_decoding"] is None) is (server == "standard")
    prompt = {"model": stack.model, "prompt": "def main(", "temperature": 0, "max_tokens": 24}
    ours = whole(via.completions.create(**prompt).model_dump())
    assert ours == whole(direct.completions.create(**prompt).model_dump())


EXTRAS = {
    "plain": {},
    "token ids": {"extra_body": {"return_token_ids": True}},
    "prompt logprobs": {"extra_body": {"prompt_logprobs": 1}},
    "logprobs": {"logprobs": True, "top_logprobs": 2},
    "tool call cut by max_tokens": {
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
}
TIMINGS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms"}


def pruned(value: Any) -> Any:
    """``value`` without nulls, ids, creation times, timings and tool call ids: what two
    answers to one greedy request share."""
    if isinstance(value, dict):
        drop = {"id", "created", "tokens_per_second", *TIMINGS}
        return {k: pruned(v) for k, v in value.items() if v is not None and k not in drop}
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


@pytest.mark.parametrize("server", ["standard", "ngram", "draft"])
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_whole_answers_are_the_pools_own(stack, gateway, server, extra):
    direct, via = clients(stack, gateway, server)
    request = {"model": stack.model, "messages": MESSAGES, "temperature": 0, "max_tokens": 12}
    request |= EXTRAS[extra]
    raw = via.chat.completions.with_raw_response.create(**request)
    theirs = direct.chat.completions.with_raw_response.create(**request)
    ours = raw.parse().model_dump()
    assert pruned(ours) == pruned(theirs.parse().model_dump())
    # every field of the pool's own answer, its nulls too, whether passed through or assembled
    ours_json, theirs_json = raw.http_response.json(), theirs.http_response.json()
    assert list(ours_json) == list(theirs_json)
    assert list(ours_json["choices"][0]) == list(theirs_json["choices"][0])
    assert list(ours_json["choices"][0]["message"]) == list(theirs_json["choices"][0]["message"])


@pytest.mark.parametrize("server", ["standard", "ngram", "draft"])
@pytest.mark.parametrize("usage", [False, True])
def test_streams(stack, gateway, server, usage):
    direct, via = clients(stack, gateway, server)
    request: dict[str, Any] = {
        "model": stack.model,
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 40,
        "stream": True,
    }
    if usage:
        request["stream_options"] = {"include_usage": True}
    raw = via.chat.completions.with_raw_response.create(**request)
    assert raw.headers["x-speclane-pool"] == server
    ours = streamed(raw.parse())
    assert ours == streamed(direct.chat.completions.create(**request))
    assert ours["text"] and (ours["usage"] is not None) is usage
    prompt = {k: v for k, v in request.items() if k != "messages"} | {"prompt": "def main("}
    ours = streamed(via.completions.create(**prompt))
    assert ours == streamed(direct.completions.create(**prompt))


@pytest.mark.parametrize("server", ["standard", "ngram"])
def test_streamed_tool_calls(stack, gateway, server):
    direct, via = clients(stack, gateway, server)
    request = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0,
        "max_tokens": 24,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ours = streamed(via.chat.completions.create(**request))
    assert ours == streamed(direct.chat.completions.create(**request))
    ((name, arguments),) = ours["tool_calls"].values()
    assert name == "get_weather" and arguments.startswith("{")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"model": "no-such-model"}, openai.NotFoundError),
        ({"max_tokens": 4096}, openai.BadRequestError),
        ({"temperature": "hot"}, openai.BadRequestError),
        ({"messages": []}, openai.BadRequestError),
    ],
)
def test_errors(stack, gateway, change, error):
    direct, via = clients(stack, gateway, "standard")
    request = {"model": stack.model, "messages": MESSAGES, "max_tokens": 8} | change
    with pytest.raises(error) as theirs:
        direct.chat.completions.create(**request)
    with pytest.raises(error) as ours:
        via.chat.completions.create(**request)
    assert ours.value.status_code == theirs.value.status_code
    body = ours.value.body
    assert isinstance(body, dict) and {"message", "type", "param", "code"} <= set(body)
    if "max_tokens" in change:  # vLLM's own answer, passed through: says where it came from
        headers = ours.value.response.headers
        assert body == theirs.value.body and headers["x-speclane-pool"] == "standard"
        assert headers["x-request-id"]


@pytest.mark.parametrize("server", ["standard", "ngram"])
@pytest.mark.parametrize("stream", [False, True])
def test_errors_vllm_sends_inside_the_stream(stack, gateway, server, stream):
    """vLLM checks ``top_logprobs`` against ``--max-logprobs`` only once its engine takes the
    request: a streamed answer opens with 200 and then carries the error as its first event.
    Through speclane the client gets that error as the answer, with its status."""
    direct, via = clients(stack, gateway, server)
    request = {
        "model": stack.model,
        "messages": MESSAGES,
        "max_tokens": 8,
        "logprobs": True,
        "top_logprobs": 50,
    }
    with pytest.raises(openai.BadRequestError) as theirs:
        direct.chat.completions.create(**request)
    with pytest.raises(openai.BadRequestError) as ours:
        answer = via.chat.completions.create(**request, stream=stream)
        list(answer) if stream else answer
    assert ours.value.body == theirs.value.body
    assert ours.value.response.headers["x-speclane-pool"] == server
