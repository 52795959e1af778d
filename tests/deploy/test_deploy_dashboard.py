"""deploy/grafana/speclane.json, checked statically: an importable dashboard whose data
source is a template variable, and whose vLLM metric names are the ones real vLLM exposes
(tests/vllm_fixtures/metrics-excerpt.txt). The gateway's own names are checked against a
running gateway in test_deploy_live.py."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy import dashboard

VLLM_METRICS = Path(__file__).resolve().parents[1] / "vllm_fixtures" / "metrics-excerpt.txt"


def test_the_data_source_is_a_template_variable() -> None:
    board = dashboard.load()
    (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    source = {"type": "prometheus", "uid": f"${{{variable['name']}}}"}
    for panel in dashboard.panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == source, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
    for other in board["templating"]["list"]:
        if other["type"] == "query":
            assert other["datasource"] == source, other["name"]


def test_panels_have_unique_ids_and_fit_the_grid() -> None:
    board = dashboard.load()
    ids = [panel["id"] for panel in dashboard.panels(board)]
    assert len(ids) == len(set(ids))
    for panel in dashboard.panels(board):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
    assert board["uid"] == "speclane"


def test_every_query_names_only_known_functions_and_metrics() -> None:
    for query in dashboard.queries(dashboard.load()):
        assert query.metrics, query.where
        assert not query.unknown, f"{query.where}: {sorted(query.unknown)} in {query.expr}"


def test_vllm_metric_names_are_what_vllm_exposes() -> None:
    exposed = {
        sample.name
        for family in text_string_to_metric_families(VLLM_METRICS.read_text())
        for sample in family.samples
    }
    used = {
        m for q in dashboard.queries(dashboard.load()) for m in q.metrics if m.startswith("vllm:")
    }
    assert used, "the dashboard shows no vLLM counters"
    assert used <= exposed, sorted(used - exposed)


def test_it_covers_what_operators_need() -> None:
    used = {m for q in dashboard.queries(dashboard.load()) for m in q.metrics}
    for family in (
        "speclane_requests_total",
        "speclane_ttft_seconds_bucket",
        "speclane_tpot_seconds_bucket",
        "speclane_accepted_draft_tokens_total",
        "speclane_draft_tokens_total",
        "speclane_decode_tokens_total",
        "speclane_decode_steps_total",
        "speclane_output_tokens_total",
        "speclane_serving_seconds_total",
        "speclane_pool_cost_per_hour",
        "speclane_guardrail_seconds_per_token",
        "speclane_request_duration_seconds_bucket",
        "speclane_request_phase_seconds_sum",
        "speclane_structured_outputs_total",
        "speclane_upstream_rejections_total",
        "speclane_guardrail_slices",
        "speclane_guardrail_offset",
        "process_resident_memory_bytes",
        "python_gc_collections_total",
        "speclane_guardrail_transitions_total",
        "speclane_failovers_total",
        "speclane_shadow_mirrors_total",
        "speclane_policy_reloads_total",
        "speclane_state_degraded",
        "speclane_requests_in_flight",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_draft_tokens_total",
    ):
        assert family in used, family
