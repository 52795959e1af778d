"""Decision quality: every scenario of ``bench/scenarios/`` replayed against a policy, priced
load-neutrally, and the table written to ``bench/RESULTS.md``.

    .venv/bin/python bench/decision_quality.py --policy bench/policies/baseline.yaml \
        --label "baseline (threshold guardrail)" --write
    .venv/bin/python bench/decision_quality.py --policy policies/examples/starter.yaml --seeds 1 2
    .venv/bin/python bench/decision_quality.py --policy bench/policies/baseline.yaml \
        --label "baseline, 32B curve" --cost-model gpu-32b   # or measured, gpu:SUMMARY.json

A scenario that names its own deployment (``policy:``, as ``eagle3-crossover`` does) runs
on that policy instead of ``--policy``. Each scenario runs on each cost model (default:
``affine``, ``gpu`` and ``gpu-32b``, one table with a row per scenario and model) once per
seed (the scenario's own seed plus the offset); the table shows the mean over seeds and the
spread when there are several. A seed draws the traffic (arrivals, bodies, acceptance), not
the exploration: probes, mirrors and explored requests are drawn from the request ids, the
scenario's name and the request's number, the same under every seed. JSON summaries and PNG
charts go to ``--out`` (default ``bench/out/decision/<label>``). ``--write`` replaces the
table of the same label in ``bench/RESULTS.md`` (or appends it), between marker comments.

Prices leave prefill out: a request pays it once wherever it runs. Where the engines keep a
prefix cache, a conversation's turn prefills what its endpoint does not hold, and that
depends on where the turns before went; ``--prefill pool`` or ``--prefill ladder`` counts it
(``gateway/replay/pinned.py``: what each pool would have held comes from replaying the
scenario pinned to it, on its own endpoints or on as many as the whole ladder has, as the
load-neutral decode prices assume).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from backends.sim.cli import COST_MODEL_HELP, cost_model_arg
from gateway.replay import pinned
from gateway.replay.chart import draw
from gateway.replay.report import CELL_MARGIN, ORACLE_MARGIN, summarise
from gateway.replay.run import replay
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

HERE = Path(__file__).parent
RESULTS = HERE / "RESULTS.md"
COST_MODELS = ("affine", "gpu", "gpu-32b")
KEYS = (
    ("adaptive_vs_oracle", "adaptive / oracle"),
    ("adaptive_vs_always_standard", "adaptive / always-standard"),
    ("adaptive_vs_always_speculative", "adaptive / always-speculative"),
    ("best_static_vs_oracle", "best static / oracle"),
    ("worst_cell_vs_always_standard", "worst class x phase / always-standard"),
)


def run(args: argparse.Namespace) -> list[list[dict[str, Any]]]:
    policy = load_policy(args.policy.read_text(), str(args.policy))
    paths = args.scenario or sorted((HERE / "scenarios").glob("*.yaml"))
    out: Path = args.out or HERE / "out" / "decision" / _slug(args.label)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in paths:
        base = load_scenario(path.read_text())
        own = (path.parent / base.policy) if base.policy else None
        deployed = load_policy(own.read_text(), str(own)) if own else policy
        for name, cost in zip(args.cost_model, args.costs, strict=True):
            per_seed = []
            for offset in args.seeds:
                scenario = base.model_copy(update={"seed": base.seed + 1000 * offset})
                started = time.perf_counter()
                result = replay(deployed, scenario, cost=cost)
                held = pinned.held(deployed, scenario, cost, args.prefill) if args.prefill else None
                summary = summarise(result, deployed, held)
                summary["seed"] = scenario.seed
                summary["cost_model"] = name
                summary["replay_s"] = round(time.perf_counter() - started, 1)
                per_seed.append(summary)
                stem = f"{scenario.name}-{_slug(name)}-seed{offset}"
                (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
                draw(result, out / f"{stem}.png")
                print(_line(summary), file=sys.stderr, flush=True)
            rows.append(per_seed)
    return rows


def _line(s: dict[str, Any]) -> str:
    v = s["verdict"]
    return (
        f"{s['scenario']:26} {s['cost_model']:8} seed {s['seed']:5}  "
        f"oracle {v['adaptive_vs_oracle']:.3f}  "
        f"std {v['adaptive_vs_always_standard']:.3f}  "
        f"spec {v['adaptive_vs_always_speculative']:.3f}"
        f"  worst {v['worst_cell_vs_always_standard']:.3f} {v['worst_cell']}"
        f"  explored {s['exploration']['share']:.1%}"
        f" (cell {s['exploration']['worst_cell']:.1%})  ({s['replay_s']} s)"
    )


def _cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def table(label: str, command: str, rows: list[list[dict[str, Any]]]) -> str:
    head = (
        "| scenario | cost model | requests | "
        + " | ".join(name for _, name in KEYS)
        + " | exploration (worst cell) | misses |"
    )
    lines = [
        f"### {label}",
        "",
        f"    {command}",
        "",
        head,
        "|" + " --- |" * (len(KEYS) + 5),
    ]
    for per_seed in rows:
        first = per_seed[0]
        values = [_cell([s["verdict"][key] for s in per_seed]) for key, _ in KEYS]
        worst = {s["verdict"]["worst_cell"] for s in per_seed}
        values[-1] += f" ({', '.join(sorted(worst))})"
        misses = _misses([s["verdict"] for s in per_seed])
        requests = round(statistics.fmean(s["requests"] for s in per_seed))
        explored = _explored(per_seed)
        lines.append(
            f"| {first['scenario']} | {first['cost_model']} | {requests} | "
            + " | ".join(values)
            + f" | {explored} | {misses} |"
        )
    return "\n".join(lines) + "\n"


def _explored(per_seed: list[dict[str, Any]]) -> str:
    """What exploring added to the scenario's cost, and to its dearest cell's (mean over
    seeds), in percent."""
    share = statistics.fmean(s["exploration"]["share"] for s in per_seed)
    worst = statistics.fmean(s["exploration"]["worst_cell"] for s in per_seed)
    names = sorted({s["exploration"]["worst_cell_name"] for s in per_seed})
    return f"{share:.1%} ({worst:.1%} {', '.join(names)})"


def _misses(verdicts: list[dict[str, Any]]) -> str:
    """The targets missed by the mean over seeds (report.py's margins)."""
    mean = {key: statistics.fmean(v[key] for v in verdicts) for key, _ in KEYS}
    out = []
    if mean["adaptive_vs_oracle"] > ORACLE_MARGIN:
        out.append("oracle")
    if mean["worst_cell_vs_always_standard"] > CELL_MARGIN:
        out.append("class x phase")
    if mean["adaptive_vs_always_speculative"] >= 1.0:
        out.append("always-speculative")
    return ", ".join(out) or "none"


def write(label: str, text: str) -> None:
    marker = f"<!-- decision-quality: {_slug(label)} -->"
    body = RESULTS.read_text()
    block = f"{marker}\n{text}{marker}\n"
    pattern = re.compile(re.escape(marker) + r".*?" + re.escape(marker) + r"\n", re.S)
    if pattern.search(body):
        body = pattern.sub(lambda _: block, body)
    else:
        body = body.rstrip("\n") + "\n\n" + block
    RESULTS.write_text(body)


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--scenario", type=Path, nargs="*", help="default: bench/scenarios/*")
    parser.add_argument("--label", default="default policy")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument(
        "--cost-model",
        nargs="+",
        default=list(COST_MODELS),
        help="one or more; " + COST_MODEL_HELP,
    )
    parser.add_argument(
        "--prefill",
        choices=["pool", "ladder"],
        help="where the engines keep a prefix cache and traffic holds conversations, count "
        "every request's prefill in its price, each pool's from the scenario replayed pinned "
        "there on its own endpoints (pool) or on as many as the ladder has (ladder)",
    )
    args = parser.parse_args()
    try:
        args.costs = [cost_model_arg(name) for name in args.cost_model]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    rows = run(args)
    seeds = " ".join(map(str, args.seeds))
    models = " ".join(args.cost_model)
    cost = f" --cost-model {models}" if tuple(args.cost_model) != COST_MODELS else ""
    cost += f" --prefill {args.prefill}" if args.prefill else ""
    command = (
        f".venv/bin/python bench/decision_quality.py --policy {args.policy} "
        f'--label "{args.label}" --seeds {seeds}{cost}'
    )
    text = table(args.label, command, rows)
    print(text)
    if args.write:
        write(args.label, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
