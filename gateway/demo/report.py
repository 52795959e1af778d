"""Render a demo ``Summary`` for people: rich tables on a console. No computation here.

The per-slice numbers are the pilot report's (``speclane report`` over the gateway's own
request records); the demo adds what only it knows: the guardrail's story, the replays
against fixed pools, and shadow traffic."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from backends.sim.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from backends.sim.model import CostModel
from gateway.demo.policy import SPEC_POOL, STANDARD_POOL
from gateway.demo.replay import ReplayRow
from gateway.demo.summary import ShadowLine, Summary
from gateway.demo.workload import DOCUMENT_TOKENS
from gateway.report import render as pilot

_PREFILL_NOTE = (
    "Per-workload rows also show who shares a server: in the adaptive run the standard server "
    "carries every long-context prompt, and the simulator prefills as vLLM does, in chunks of "
    f"at most {DEFAULT_MAX_NUM_BATCHED_TOKENS} tokens a step beside the decodes, so a "
    f"{DOCUMENT_TOKENS // 1000}k-token summary slows the steps it shares on that server by "
    f"~{CostModel().prefill_per_token_s * DOCUMENT_TOKENS:.1f} s of model time in all."
)


def _ms(seconds: float | None, scale: float = 1.0) -> str:
    return "-" if seconds is None else f"{seconds * 1000 / scale:.1f}"


def show(console: Console, summary: Summary) -> None:
    scale = float(summary.options["time_scale"])
    console.print()
    pilot.show(console, summary.pilot)
    if scale != 1:
        console.print(
            f"times in the report are wall-clock: model time x {scale:g} (the sims' --time-scale)",
            style="dim",
        )
    console.print(_drift_line(summary.drift))
    console.print(_events(summary))
    console.print(_replay(summary.replay))
    console.print(_PREFILL_NOTE, style="dim")
    console.print(_shadow(summary.shadow))


def _drift_line(drift: dict[str, float]) -> Text:
    if not drift:
        return Text("drift: no change of acceptance was applied in this run", style="dim")
    parts = [f"collapsed at {drift['collapse']:.1f} s"] if "collapse" in drift else []
    if "recover" in drift:
        parts.append(f"recovered at {drift['recover']:.1f} s")
    return Text("drift: the speculative pool's code acceptance " + " and ".join(parts))


def _events(summary: Summary) -> Table | Text:
    if not summary.events:
        return Text("(b) guardrail: no events in this run", style="bold")
    table = Table(title="(b) Guardrail events (GET /admin/guardrail)", title_justify="left")
    for head in ("since start", "slice", "from → to", "reason"):
        table.add_column(head, justify="right" if head == "since start" else "left")
    for event in summary.events:
        table.add_row(f"{event.at_s:.1f} s", event.slice, event.moves, event.reason)
    return table


def _replay(rows: list[ReplayRow]) -> Table:
    table = Table(
        title="(c) What the routing cost: decode seconds of one server per request, priced "
        "load-neutrally with the simulator's cost model",
        title_justify="left",
        caption="every request priced on each pool at the load the run actually carried "
        "(its true acceptance, the drift included); 'oracle' takes the cheaper pool per "
        "workload and phase; the same load for every way keeps capacity out of it; 'adaptive' "
        "includes what shadow mirrors cost (creative) and the pilot's standard arm (chat)",
    )
    heads = ("workload", "requests", "adaptive", "always speculative", "always standard")
    for head in (*heads, "oracle", "adaptive vs oracle"):
        table.add_column(head, justify="left" if head == "workload" else "right")
    for row in rows:
        label = row.workload.value if row.workload else "all"
        cost = row.cost
        n = max(row.requests, 1)
        table.add_row(
            Text(label, style="bold" if row.workload is None else ""),
            str(row.requests),
            *(_per_request(cost[way], n) for way in ("routed", "speculative", "standard")),
            _per_request(cost["oracle"], n),
            _versus(cost),
        )
    return table


def _per_request(seconds: float | None, n: int) -> str:
    return "-" if seconds is None else f"{seconds / n * 1000:.1f} ms"


def _versus(cost: dict[str, float | None]) -> str:
    routed, oracle = cost["routed"], cost["oracle"]
    if routed is None or not oracle:
        return "-"
    return f"{routed / oracle:.2f}x"


def _shadow(shadow: ShadowLine) -> Text:
    mirrors = shadow.mirrors
    started = mirrors.get("started", 0)
    dropped = sum(n for result, n in mirrors.items() if result.startswith("dropped"))
    rate = shadow.window_acceptance
    measured = "no mirror measured in the last window"
    if rate is not None:
        measured = (
            f"{shadow.measured_in_window} mirrors measured in the last {shadow.window_s:g} s, "
            f"draft acceptance {rate:.2f}"
        )
    return Text(
        f"(d) shadow: {shadow.creative_requests} creative requests answered by {STANDARD_POOL}; "
        f"{shadow.mirrored_decisions} chosen for mirroring to {SPEC_POOL}; {started} mirrors "
        f"started in all (the guardrail's short probes and explorations among them), "
        f"{dropped} dropped by limits; /admin/stats: {measured}"
    )
