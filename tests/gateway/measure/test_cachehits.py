"""The prefix cache's hit ratio: read from each API's usage (chat's and completions'
``prompt_tokens_details``, Responses' ``input_tokens_details``, Messages'
``cache_read_input_tokens``), tallied per pool and endpoint for ``/admin/stats`` and the
metrics, and summed from outcome records for ``speclane report``; answers that do not say
count nowhere."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from gateway.measure.acceptance import Fold, Labels, Outcome, Status
from gateway.measure.answer import Measurement
from gateway.measure.cachehits import CacheHits
from gateway.measure.checks import Checks
from gateway.measure.completions import COMPLETIONS
from gateway.measure.messages import MESSAGES
from gateway.measure.outcomelog import record
from gateway.measure.responses import RESPONSES
from gateway.measure.telemetry import Telemetry
from gateway.report.cache import cache_rows
from gateway.report.render import as_json
from gateway.report.stats import build

A, B = "http://a:8000", "http://b:8000"


def measured(dialect: object, body: dict, endpoint: str = A) -> Outcome:
    recorded: list[Outcome] = []
    labels = Labels("m", "r", "r / s", "spec", 4, endpoint=endpoint)
    measurement = Measurement(Fold(labels, 0.0, 0.001), lambda: 1.0, Checks(recorded.append))
    dialect.whole(measurement, body)  # type: ignore[attr-defined]
    measurement.finish(Status.OK)
    return recorded[0]


CHAT = {
    "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 470,
        "completion_tokens": 32,
        "prompt_tokens_details": {"cached_tokens": 384},
    },
}
MESSAGES_BODY = {
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 470, "output_tokens": 32, "cache_read_input_tokens": 384},
}
RESPONSES_BODY = {
    "id": "resp_1",
    "status": "completed",
    "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
    "usage": {
        "input_tokens": 470,
        "output_tokens": 32,
        "input_tokens_details": {"cached_tokens": 384},
    },
}


@pytest.mark.parametrize(
    "dialect, body", [(COMPLETIONS, CHAT), (MESSAGES, MESSAGES_BODY), (RESPONSES, RESPONSES_BODY)]
)
def test_each_api_says_how_much_of_the_prompt_was_cached(dialect, body):
    outcome = measured(dialect, body)
    assert (outcome.prompt_tokens, outcome.cached_tokens) == (470, 384)


def test_an_answer_that_does_not_say_has_no_cached_figure():
    body = CHAT | {"usage": {"prompt_tokens": 470, "completion_tokens": 32}}
    assert measured(COMPLETIONS, body).cached_tokens is None
    plain = MESSAGES_BODY | {"usage": {"input_tokens": 470, "output_tokens": 3}}
    assert measured(MESSAGES, plain).cached_tokens is None


def test_hits_are_tallied_per_pool_and_endpoint():
    hits = CacheHits()
    hits.add(measured(COMPLETIONS, CHAT, A))
    hits.add(measured(MESSAGES, MESSAGES_BODY, B))
    hits.add(
        measured(COMPLETIONS, CHAT | {"usage": {"prompt_tokens": 100, "completion_tokens": 1}}, B)
    )
    spec = hits.summary()["spec"]
    assert spec["requests"] == 2 and spec["prompt_tokens"] == 940 and spec["cached_tokens"] == 768
    assert spec["hit_ratio"] == pytest.approx(768 / 940)
    assert spec["endpoints"][A]["hit_ratio"] == pytest.approx(384 / 470)


def test_the_metrics_count_prompt_and_cached_tokens_by_pool_and_endpoint():
    telemetry = Telemetry.build()
    telemetry.opened("spec", shadow=False)
    telemetry.observe(measured(COMPLETIONS, CHAT, A))
    text = generate_latest(telemetry.exposition).decode()
    assert f'speclane_prompt_tokens_total{{endpoint="{A}",pool="spec"}} 470.0' in text
    assert f'speclane_cached_prompt_tokens_total{{endpoint="{A}",pool="spec"}} 384.0' in text


def test_the_report_sums_the_records_per_pool_and_endpoint():
    outcomes = [measured(COMPLETIONS, CHAT, A), measured(RESPONSES, RESPONSES_BODY, B)]
    records = [record(o, 1000.0 + i, None) for i, o in enumerate(outcomes)]
    records.append(
        record(measured(COMPLETIONS, CHAT | {"usage": {"prompt_tokens": 9}}, B), 1003.0, None)
    )
    rows = cache_rows(records)
    assert [(r.pool, r.endpoint, r.prompt_tokens, r.cached_tokens) for r in rows] == [
        ("spec", "", 940, 768),
        ("spec", A, 470, 384),
        ("spec", B, 470, 384),
    ]
    shown = as_json(build(records))["prefix_cache"]
    assert shown[0] == {
        "pool": "spec",
        "endpoint": None,
        "requests": 2,
        "prompt_tokens": 940,
        "cached_tokens": 768,
        "hit_ratio": pytest.approx(768 / 940),
    }
