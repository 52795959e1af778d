"""Checking answers off the event loop: short ones at once, long ones in a worker thread
(the outcome is recorded when the check is done), too long or too many waiting: skipped."""

from __future__ import annotations

import asyncio

import pytest

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.checks import Checks
from gateway.measure.validity import Collected, expect

pytestmark = pytest.mark.anyio
EXPECT = expect({"response_format": {"type": "json_object"}})
OUTCOME = Outcome(
    Labels("m", "r", "s", "p", None), Status.OK, 0, 1, 0.1, 0.01, 1, 9, 9, Signal.NONE
)


def answer(size: int) -> Collected:
    collected = Collected()
    collected.delta({"index": 0, "delta": {"content": '{"a": "' + "x" * size + '"}'}})
    collected.delta({"index": 0, "delta": {}, "finish_reason": "stop"})
    return collected


async def test_short_answers_at_once_long_ones_in_a_thread_the_rest_skipped() -> None:
    recorded: list[Outcome] = []
    checks = Checks(recorded.append, inline_bytes=1000, max_bytes=1_000_000, max_pending=1)
    checks.finish(OUTCOME, EXPECT, answer(10))
    assert [o.checks for o in recorded] == [(("json_object", "valid"),)]
    checks.finish(OUTCOME, EXPECT, answer(200_000))  # in a thread
    checks.finish(OUTCOME, EXPECT, answer(200_000))  # one is already waiting
    checks.finish(OUTCOME, EXPECT, answer(2_000_000))  # beyond max_bytes
    assert [o.checks for o in recorded[1:]] == [(("json_object", "skipped"),)] * 2
    for _ in range(500):
        if len(recorded) == 4:
            break
        await asyncio.sleep(0.01)
    assert recorded[3].checks == (("json_object", "valid"),)
    failed = Outcome(OUTCOME.labels, Status.ERROR, 0, 1, None, None, 0, 0, 0, Signal.NONE)
    checks.finish(failed, EXPECT, answer(10))  # only answers the client got are checked
    assert recorded[-1].checks == ()
    await checks.close()
