"""Render a demo ``Summary`` for people: rich tables on a console. No computation here."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from backends.sim.model import CostModel
from gateway.demo.policy import SPEC_POOL, STANDARD_POOL
from gateway.demo.replay import ReplayRow
from gateway.demo.summary import ShadowLine, Summary, WorkloadRow
from gateway.demo.workload import DOCUMENT_TOKENS

_PREFILL_NOTE = (
    "Per-workload rows also show who shares a server: in the adaptive run the standard server "
    "carries every long-context prompt, and the simulator prefills a prompt in one engine step "
    f"(no chunked prefill), so a {DOCUMENT_TOKENS // 1000}k-token summary stalls everything on "
    f"that server for ~{CostModel().prefill_per_token_s * DOCUMENT_TOKENS:.1f} s of model time."
)


def _ms(seconds: float | None, scale: float = 1.0) -> str:
    return "-" if seconds is None else f"{seconds * 1000 / scale:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def show(console: Console, summary: Summary) -> None:
    scale = float(summary.options["time_scale"])
    console.print()
    console.print(_workloads(summary.workloads, scale))
    console.print(_drift_line(summary.drift))
    console.print(_events(summary))
    console.print(_replay(summary.replay))
    console.print(_PREFILL_NOTE, style="dim")
    console.print(_shadow(summary.shadow, float(summary.options["guardrail"]["min_acceptance"])))


def _workloads(rows: list[WorkloadRow], scale: float) -> Table:
    caption = "TTFT and TPOT: measured by the client, in ms of model time"
    if scale != 1:
        caption += f" (wall-clock ms / {scale:g}, the sims' --time-scale)"
    table = Table(title="(a) Per workload", title_justify="left", caption=caption)
    table.add_column("workload", no_wrap=True)
    heads = ["requests", "errors", f"on {SPEC_POOL}", f"on {STANDARD_POOL}"]
    heads += ["mean acc. length", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
    for head in heads:
        table.add_column(head, justify="right")
    for row in rows:
        std = None if row.spec_share is None else 1 - row.spec_share
        length = "-" if row.mean_acceptance_length is None else f"{row.mean_acceptance_length:.2f}"
        table.add_row(
            row.label,
            str(row.requests),
            str(row.errors),
            _share(row.spec_share),
            _share(std),
            length,
            _ms(row.ttft_p50_wall_s, scale),
            _ms(row.ttft_p99_wall_s, scale),
            _ms(row.tpot_p50_wall_s, scale),
            _ms(row.tpot_p99_wall_s, scale),
        )
    return table


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
        title="(c) Mean time per output token, ms of model time: virtual-time replays of the "
        "recorded trace (same arrival offsets, bodies and drift schedule)",
        title_justify="left",
        caption="open-loop replays through backends.sim.virtual on two servers each: "
        "'adaptive' sends each request to the pool the gateway chose (shadow mirrors add load "
        "to the speculative one), 'always X' deals requests in turn to two X servers",
    )
    heads = ("workload", "requests", "adaptive", "always speculative", "always standard")
    for head in (*heads, "adaptive vs best fixed"):
        table.add_column(head, justify="left" if head == "workload" else "right")
    for row in rows:
        label = row.workload.value if row.workload else "all"
        tpot = row.tpot_s
        table.add_row(
            Text(label, style="bold" if row.workload is None else ""),
            str(row.requests),
            _ms(tpot["routed"]),
            _ms(tpot["speculative"]),
            _ms(tpot["standard"]),
            _versus(tpot),
        )
    return table


def _versus(tpot: dict[str, float | None]) -> str:
    fixed = [v for k, v in tpot.items() if k != "routed" and v is not None]
    routed = tpot["routed"]
    if routed is None or not fixed or not min(fixed):
        return "-"
    return f"{routed / min(fixed):.2f}x"


def _shadow(shadow: ShadowLine, floor: float) -> Text:
    mirrors = shadow.mirrors
    started = mirrors.get("started", 0)
    dropped = sum(n for result, n in mirrors.items() if result.startswith("dropped"))
    rate = shadow.window_acceptance
    measured = "no mirror measured in the last window"
    if rate is not None:
        verdict = "below" if rate < floor else "above"
        measured = (
            f"{shadow.measured_in_window} mirrors measured in the last {shadow.window_s:g} s, "
            f"draft acceptance {rate:.2f} ({verdict} the {floor:g} floor)"
        )
    return Text(
        f"(d) shadow: {shadow.creative_requests} creative requests answered by {STANDARD_POOL}; "
        f"{shadow.mirrored_decisions} chosen for mirroring to {SPEC_POOL}, {started} mirrors "
        f"started, {dropped} dropped by limits; /admin/stats: {measured}"
    )
