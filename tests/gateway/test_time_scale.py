"""A gateway in a time-scaled simulator's time, and the body of a short probe."""

from __future__ import annotations

import pytest

from gateway.apis import APIS
from gateway.forward.shadow import short_probe
from gateway.server.app import scaled
from gateway.settings import Settings


def test_a_scaled_clock_runs_faster_and_replicas_agree_on_it():
    real = [86_400.0 * 20_000 + 100.0]
    clock = scaled(lambda: real[0], 0.25)
    other = scaled(lambda: real[0], 0.25)  # another replica, started later the same day
    before = clock()
    real[0] += 2.0
    assert clock() - before == pytest.approx(8.0)
    assert other() == clock()
    assert scaled(time_real := (lambda: 5.0), 1.0) is time_real
    assert Settings(time_scale=0.1).real_s(10.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("payload", "path", "capped"),
    [
        ({"max_tokens": 500}, "/v1/chat/completions", {"max_tokens": 16}),
        ({"max_tokens": 8}, "/v1/completions", {"max_tokens": 8}),
        ({"max_completion_tokens": 300}, "/v1/chat/completions", {"max_completion_tokens": 16}),
        ({}, "/v1/chat/completions", {"max_tokens": 16}),
        ({}, "/v1/responses", {"max_output_tokens": 16}),
        ({"max_output_tokens": 90}, "/v1/responses", {"max_output_tokens": 16}),
    ],
)
def test_a_short_probe_asks_for_few_tokens_whichever_way_its_api_names_them(payload, path, capped):
    limit = APIS.named(path).limit
    assert short_probe({"model": "m", **payload}, limit, 16) == {"model": "m", **capped}
