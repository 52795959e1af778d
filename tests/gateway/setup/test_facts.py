"""What ``speclane init`` reads from an endpoint's pages, on pages real vLLM 0.32 served
(``tests/vllm_fixtures``), and what it concludes from them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gateway.setup import facts
from gateway.setup.found import Pages, advice, recognise
from policies.model import Engine

REAL = Path(__file__).parents[2] / "vllm_fixtures"


def test_real_vllm_pages_show_speculation_and_k():
    assert facts.models((REAL / "models.json").read_bytes()) == facts.Models(
        ("tiny",), "vllm", ("tiny/target",)
    )
    standard = facts.vllm_page((REAL / "standard" / "metrics.txt").read_text())
    ngram = facts.vllm_page((REAL / "ngram" / "metrics.txt").read_text())
    assert (standard.speculates, standard.k) == (False, None)
    assert (ngram.speculates, ngram.k) == (True, 4)  # positions 0-3 of the per-position counter
    assert ngram.drafts > 0 and ngram.generated > 0


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("chat-stream-include-usage.sse", facts.Answer(13, 32, per_request=True)),
        ("completions-stream-include-usage.sse", facts.Answer(10, 24, per_request=True)),
        ("standard/chat-stream-include-usage.sse", facts.Answer(24, 32, per_request=False)),
        ("chat-stream.sse", facts.Answer(13, 0, per_request=False)),  # no usage asked
    ],
)
def test_a_real_answer_says_what_it_carried(fixture, expected):
    assert facts.answer((REAL / fixture).read_bytes()) == expected


def ngram_server(answered: str) -> Pages:
    """The real ngram server's pages, the probe answered with the fixture ``answered``."""
    metrics = (REAL / "ngram" / "metrics.txt").read_text()
    return Pages(
        "http://spec:8000",
        facts.Models(("tiny",), "vllm", ("tiny/target",)),
        version="0.32.0",
        metrics=metrics,
        metrics_after=metrics,
        answer=facts.answer((REAL / answered).read_bytes()),
    )


def test_a_real_speculative_vllm_with_the_flag_needs_no_advice():
    pages = ngram_server("chat-stream-include-usage.sse")
    found = recognise(pages)
    assert (found.engine, found.speculates, found.k, found.per_request) == (
        Engine.VLLM, True, 4, True
    )  # fmt: skip
    assert advice(found, "spec") == []
    assert advice(found, "standard") == [
        "http://spec:8000 was given as standard but speculates: check its flags"
    ]


def test_without_per_request_metrics_the_flag_is_named():
    pages = ngram_server("standard/chat-stream-include-usage.sse")  # an answer without them
    [line] = advice(recognise(pages), "spec")
    assert "--per-request-spec-decode-metrics summary" in line
    older = advice(recognise(replace(pages, version="0.28.1")), "spec")
    assert older and "vLLM >= 0.29" in older[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.32.0", True), ("0.29.0rc1", True), ("0.11.0", False), ("v1", None), (None, None)],
)
def test_versions(text, expected):
    assert facts.version_at_least(text, (0, 29)) is expected


@pytest.mark.parametrize(
    "body", [b"", b"[]", b'{"data": []}', b'{"data": [{"object": "model"}]}', b"\xff"]
)
def test_a_page_that_is_not_a_model_list_is_said_so(body):
    with pytest.raises(ValueError):
        facts.models(body)
