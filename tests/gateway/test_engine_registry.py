"""The registry of the serving engines, and what each engine's module reads of an answer:
every engine-specific read of the gateway comes from it."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.engines import ENGINES, Registry, Said
from gateway.engines.recognition import Models, Pages
from gateway.setup.found import recognise
from policies.engines import PROFILES
from policies.model import Engine as Named


def test_the_policy_lint_has_facts_for_every_built_in_engine():
    """``policies/`` may not import the registry: its engines must be the same."""
    assert set(ENGINES.names) == {e.value for e in Named} == {e.value for e in PROFILES}


def test_a_registry_refuses_two_engines_of_one_name():
    with pytest.raises(ValueError, match="share a name"):
        ENGINES.plus(dataclasses.replace(ENGINES.of("vllm")))
    with pytest.raises(KeyError):
        ENGINES.of("tally")
    assert isinstance(ENGINES.plus(), Registry) and len(ENGINES.plus()) == 4


def test_only_the_engines_that_reproduce_their_answers_field_by_field_are_assembled():
    assert [e.name for e in ENGINES if e.assembles] == ["vllm", "vllm-neuron"]


def test_a_field_asked_on_the_gateways_account_is_the_clients_only_when_it_asked_too():
    sglang = ENGINES.of("sglang")
    assert sglang.asks == {"return_spec_tokens_details": True}
    assert sglang.asked_by({"return_spec_tokens_details": True})
    assert not sglang.asked_by({"return_spec_tokens_details": 1})
    assert not sglang.asked_by({})
    assert not ENGINES.of("vllm").asked_by({"return_spec_tokens_details": True})  # asks nothing
    own = sglang.own
    assert own is not None and own({"choices": [], "usage": None, "sglext": {}})
    assert not own({"choices": [{"delta": {}}], "sglext": {}})


SPEC = {"num_draft_tokens": 8, "num_accepted_draft_tokens": 6, "num_spec_steps": 2}
SGLEXT = {"spec_verify_ct": 3, "spec_num_proposed_drafts": 12, "spec_num_correct_drafts": 6}


@pytest.mark.parametrize(
    ("engine", "answer", "said"),
    [
        ("vllm", {"metrics": {"speculative_decoding": SPEC}}, Said(8, 6, 3, None)),
        ("vllm-neuron", {"metrics": {"speculative_decoding": SPEC}}, None),  # fused: ignored
        ("sglang", {"choices": [], "sglext": {"spec_tokens_details": SGLEXT}}, Said(12, 6, 3)),
        ("sglang", {"metrics": {"speculative_decoding": SPEC}}, None),
        ("trtllm", {"choices": [{"avg_decoded_tokens_per_iter": 2.5}]}, Said(0, 0, 3)),
        ("trtllm", {"sglext": {"spec_tokens_details": SGLEXT}}, None),
    ],
)
def test_each_engine_reads_its_own_figures_and_no_other(engine, answer, said):
    """Ten tokens from a pool of k=4, the stream showing no steps."""
    evidence = ENGINES.of(engine).evidence(answer)
    assert (None if evidence is None else evidence.said(10, 4, 0)) == said


def test_a_whole_trtllm_answer_says_its_first_choice():
    choices = [{"avg_decoded_tokens_per_iter": 2.5}, {"avg_decoded_tokens_per_iter": 5.0}]
    trtllm = ENGINES.of("trtllm")
    whole, chunk = trtllm.whole({"choices": choices}), trtllm.evidence({"choices": choices})
    assert whole is not None and whole.tokens_per_step == 2.5
    assert chunk is not None and chunk.tokens_per_step == 5.0  # a chunk's last choice


def test_only_the_engines_that_run_vllm_say_its_times():
    metrics = {"metrics": {"time_to_first_token_ms": 80, "queue_time_ms": 20, "mean_itl_ms": 5}}
    timed = {e.name: e.timings(metrics) for e in ENGINES}
    assert timed["vllm"] == timed["vllm-neuron"] and timed["vllm"] is not None
    assert timed["vllm"].queue_s == pytest.approx(0.02)
    assert timed["sglang"] is None and timed["trtllm"] is None


@pytest.mark.parametrize(
    ("owner", "metrics", "engine"),
    [
        ("vllm", None, "vllm"),
        ("sglang", None, "sglang"),
        ("someone", "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n", "sglang"),
        ("tensorrt_llm", None, "trtllm"),
        ("someone", None, "vllm"),  # no other engine recognises it
    ],
)
def test_init_asks_each_engine_and_takes_the_first_row_for_the_rest(owner, metrics, engine):
    pages = Pages("http://e:1", Models(("m",), owner), metrics=metrics)
    assert recognise(pages).engine == engine
