"""The gateway in front of a fake upstream replaying real vLLM responses, driven by the
official openai client over real sockets."""

from __future__ import annotations

import openai
import pytest

from tests.fakes import FakeUpstream
from tests.gateways import fake_stack

pytestmark = pytest.mark.anyio


async def test_streaming_chat_relays_every_chunk_and_drops_usage_unless_asked(tmp_path):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        chunks = [c async for c in stream]
        with_usage = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        usage_chunks = [c async for c in with_usage]
        await client.close()
    assert fake.received[0]["stream"] is True
    assert fake.received[0]["stream_options"] == {"include_usage": True}
    assert all(c.usage is None for c in chunks)
    assert len(chunks) == 14  # the role chunk and 13 content chunks, as captured
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.count(".") == 10
    assert usage_chunks[-1].usage is not None and usage_chunks[-1].usage.completion_tokens == 32


async def test_non_streaming_chat_is_assembled(tmp_path):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}]
        )
        await client.close()
    answer = raw.parse()
    assert answer.object == "chat.completion"
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.content.count("\n") == 11
    assert answer.usage.completion_tokens == 32
    assert raw.headers["x-speclane-pool"] == "spec"
    assert raw.headers["x-speclane-rule"] == "default"
