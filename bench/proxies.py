"""speclane beside the proxies one would put in its place, in one run, on one canned upstream.

  direct              load generator -> nginx (the canned upstream of bench/canned.py)
  bare, bare-2w       bench/bare_proxy.py (Starlette + aiohttp, relays bytes), 1 and 2 workers
  vllm-router         the vLLM project's Rust router, its default policy (bench/peers.py)
  litellm             LiteLLM's proxy, one worker (bench/peers.py)
  speclane            speclane serve, its JSON answers passed through as the pool sends them
  speclane-asm        speclane serve, JSON answers streamed upstream and assembled
  speclane-2w, speclane-asm-2w   the same with --workers 2, sharing state through Redis

Every cell (configuration x concurrency x stream/json) gets --warmup seconds of load, then
--duration measured seconds, by wrk (closed loop, one connection per concurrent request).
The configurations of a cell run back to back, in an order that rotates each round, and
every figure is a median over rounds of per-round values, ratios taken within a round. CPU
per request is the proxy's whole process group (every worker) over the measured window.
LiteLLM and vllm-router are installed from PyPI into venvs of their own on first use; one
that cannot be installed or started is skipped with the reason. Needs nginx and wrk
(``apt-get install nginx-light wrk``); without them the benchmark says SKIPPED and exits 0.

    .venv/bin/python bench/proxies.py                   # 3 rounds of 10 s cells: ~35 min
    .venv/bin/python bench/proxies.py --rounds 1 --duration 3 --configs direct,bare,speclane

``--routes chat,messages,responses`` measures the other APIs speclane routes too, on the
same canned answers in their shapes (Anthropic's Messages, OpenAI's Responses): every
configuration that can carry a route (direct, bare, speclane; not vllm-router or LiteLLM,
which are measured on chat) gets a row per route, named ``NAME ROUTE``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import canned
import orjson
import peers
import proxies_report as summary
import report
from loaders import OTHER, Measurement, Wrk
from overhead import SKIPPED, check, policy_text, start_nginx, wait_quiet
from procs import Child, Supervisor, busiest_others, free_port, signals_interrupt

CHAT = "/v1/chat/completions"
ROOT = Path(__file__).resolve().parent.parent
ALL = "direct,bare,bare-2w,vllm-router,litellm,speclane,speclane-asm,speclane-2w,speclane-asm-2w"


@dataclass(frozen=True, slots=True)
class Config:
    """One proxy as measured: where to send load, whose CPU to count, which answers."""

    name: str
    url: str
    watched: dict[str, Child]
    how: str
    modes: tuple[str, ...] = ("stream", "json")
    models: dict[str, str] = field(default_factory=dict)  # mode -> model in the body


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/proxies.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--duration", type=float, default=10.0, metavar="S", help="measured s per cell (10)")
    add("--warmup", type=float, default=2.0, metavar="S", help="unmeasured s before each (2)")
    add("--rounds", type=int, default=3, metavar="N", help="rounds; medians reported (3)")
    add("--concurrency", default="1,64", metavar="LIST", help="connections (default 1,64)")
    add("--modes", default="stream,json", metavar="LIST", help="stream and/or json")
    add("--configs", default=ALL, metavar="LIST", help=f"what to run (default {ALL})")
    add(
        "--routes",
        default="chat",
        metavar="LIST",
        help=f"APIs to measure: {', '.join(canned.ROUTES)} (default chat)",
    )
    add("--workers", type=int, default=2, metavar="N", help="workers of the -2w configs (2)")
    add(
        "--redis-url",
        default="redis://127.0.0.1:6379/0",
        help="Redis for speclane's workers to share state (default redis://127.0.0.1:6379/0)",
    )
    add(
        "--speclane-base",
        type=Path,
        metavar="BIN",
        help="another build's speclane executable: its speclane and speclane-asm cells run "
        "too, named '@base', side by side with this build's",
    )
    add("--quiet-below", type=float, default=40.0, metavar="PCT", help=argparse.SUPPRESS)
    add("--patience", type=float, default=10.0, metavar="S", help=argparse.SUPPRESS)
    add("--json", type=Path, metavar="PATH", help="raw numbers (default bench/out/proxies-*.json)")
    add("--report", type=Path, metavar="PATH", help="measure nothing; print a --json file again")
    add("--keep-logs", action="store_true", help="keep the temp dir with configs and logs")
    return parser


def speclane_bin() -> str:
    script = Path(sys.executable).with_name("speclane")
    return str(script) if script.exists() else shutil.which("speclane") or "speclane"


def _has_workers(binary: str) -> bool:
    argv = [binary, "serve", "--help"]
    text = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    return "--workers" in text


def start_speclane(
    sup: Supervisor,
    tmp: Path,
    upstream: str,
    *,
    name: str,
    binary: str,
    passthrough: bool,
    workers: int = 1,
    redis_url: str = "",
) -> tuple[str, Child]:
    port = free_port()
    policy = tmp / f"{name}.yaml"
    # the default guardrail: what speclane runs with unless told otherwise
    policy.write_text(policy_text(upstream, passthrough=passthrough, guardrail=""))
    argv = [binary, "serve", "--policy", str(policy), "--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    env["SPECLANE_LOG_LEVEL"] = "warning"
    if workers > 1:
        argv += ["--workers", str(workers), "--redis-url", redis_url]
        env["SPECLANE_NAMESPACE"] = f"bench-{name}-{os.getpid()}"
    child = sup.start(name, argv, env)
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, url + "/healthz")
    return url, child


def start_bare(sup: Supervisor, upstream: str, workers: int, name: str) -> tuple[str, Child]:
    port = free_port()
    script = Path(__file__).with_name("bare_proxy.py")
    argv = [sys.executable, str(script), "--upstream", upstream, "--port", str(port)]
    argv += ["--workers", str(workers)]
    child = sup.start(name, argv)
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, url + "/healthz")
    return url, child


def _configs(
    args: argparse.Namespace, sup: Supervisor, tmp: Path, nginx: Child, upstream: str
) -> list[Config]:
    out: list[Config] = []
    for name in (c.strip() for c in args.configs.split(",")):
        builds = [("", speclane_bin())]
        if args.speclane_base and name in ("speclane", "speclane-asm"):
            builds.append(("@base", str(args.speclane_base)))
        for suffix, binary in builds:
            try:
                started = _start(args, sup, tmp, nginx, upstream, name + suffix, binary)
            except (peers.Skipped, RuntimeError) as exc:
                print(f"  SKIPPED {name + suffix}: {exc}", flush=True)
                continue
            out += _per_route(args, started)
    return out


_ROUTED = ("direct", "bare", "speclane")  # the configurations that carry every route


def _per_route(args: argparse.Namespace, config: Config) -> list[Config]:
    """``config`` once per route asked for: its chat row as it was, a row per other route
    where the configuration carries it."""
    out = []
    for route in (r.strip() for r in args.routes.split(",")):
        if route not in canned.ROUTES:
            raise SystemExit(f"unknown route {route!r}: give {', '.join(canned.ROUTES)}")
        if route == "chat":
            out.append(config)
        elif config.name.startswith(_ROUTED):
            url = config.url.removesuffix(CHAT) + canned.ROUTES[route]
            name = f"{config.name} {route}"
            out.append(Config(name, url, config.watched, config.how, config.modes, config.models))
    return out


def _start(
    args: argparse.Namespace,
    sup: Supervisor,
    tmp: Path,
    nginx: Child,
    upstream: str,
    name: str,
    binary: str,
) -> Config:
    """Start the configuration ``name``; ``Skipped`` or ``RuntimeError`` when it cannot."""
    n = args.workers
    if name == "direct":
        return Config(name, upstream + CHAT, {"upstream": nginx}, "nginx, 1 worker")
    if name in ("bare", "bare-2w"):
        w = 1 if name == "bare" else n
        url, child = start_bare(sup, upstream, w, name)
        return _config(name, url, child, nginx, f"Starlette + aiohttp, {w} worker(s)")
    if name in ("vllm-router", "litellm"):
        if name == "litellm":
            started = peers.start_litellm(sup, tmp, upstream)
            models = {"stream": peers.STREAM_MODEL}
        else:
            started, models = peers.start_vllm_router(sup, tmp, upstream), {}
        return _config(name, started.url, started.child, nginx, started.how, models=models)
    if not name.startswith("speclane"):
        raise SystemExit(f"unknown configuration {name!r}")
    passthrough = "-asm" not in name
    workers = n if "-2w" in name else 1
    if workers > 1 and not _has_workers(binary):
        raise RuntimeError(f"{binary} has no --workers")
    url, child = start_speclane(
        sup,
        tmp,
        upstream,
        name=name,
        binary=binary,
        passthrough=passthrough,
        workers=workers,
        redis_url=args.redis_url,
    )
    how = "JSON passed through" if passthrough else "JSON streamed upstream and assembled"
    how += f", {workers} workers, state in Redis" if workers > 1 else ", 1 process"
    modes = ("stream", "json") if passthrough else ("json",)
    return _config(name, url, child, nginx, how, modes=modes)


def _config(
    name: str,
    url: str,
    child: Child,
    nginx: Child,
    how: str,
    *,
    modes: tuple[str, ...] = ("stream", "json"),
    models: dict[str, str] | None = None,
) -> Config:
    return Config(name, url + CHAT, {"proxy": child, "upstream": nginx}, how, modes, models or {})


def _measure(
    args: argparse.Namespace, sup: Supervisor, wrk: Wrk, config: Config, conc: int, mode: str
) -> Measurement:
    """Measure once the rest of the machine is quiet enough; once more if it got busy."""
    best: Measurement | None = None
    stream = mode == "stream"
    model = config.models.get(mode, canned.MODEL)
    for _ in range(2):
        wait_quiet(sup, args.quiet_below, args.patience)
        m = wrk.measure(config.url, conc, stream, args.warmup, args.duration, config.watched, model)
        if best is None or m.cpu_s.get(OTHER, 0) < best.cpu_s.get(OTHER, 0):
            best = m
        if (m.cpu_percent(OTHER) or 0.0) < args.quiet_below:
            break
        print(f"  ({config.name}: other processes used {m.cpu_percent(OTHER):.0f} % CPU; again)")
    assert best is not None
    return best


def run_rounds(
    args: argparse.Namespace, sup: Supervisor, wrk: Wrk, configs: list[Config]
) -> list[report.Record]:
    records = []
    modes = [m.strip() for m in args.modes.split(",")]
    for r in range(args.rounds):
        for conc in (int(c) for c in args.concurrency.split(",")):
            for mode in modes:
                print(f"round {r + 1}/{args.rounds}  concurrency {conc}  {mode}", flush=True)
                cell = [c for c in configs if mode in c.modes]
                shift = r % max(1, len(cell))
                for config in cell[shift:] + cell[:shift]:
                    m = _measure(args, sup, wrk, config, conc, mode)
                    rec = report.Record(r, config.name, conc, mode, m)
                    print(summary.line(rec), flush=True)
                    records.append(rec)
    return records


def _check_all(configs: list[Config]) -> None:
    for config in configs:
        for mode in config.modes:
            model = config.models.get(mode, canned.MODEL)
            print(check(config.url, config.name, mode == "stream", model), flush=True)


def main() -> int:
    args = _parser().parse_args()
    if args.report:
        data = orjson.loads(args.report.read_bytes())
        print(summary.render(report.from_json(data), data["machine"], data["how"]))
        return 0
    nginx_bin = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if nginx_bin is None or Wrk.find() is None:
        print(
            "SKIPPED: needs nginx and wrk (Debian/Ubuntu: apt-get install nginx-light wrk)",
            file=sys.stderr,
        )
        return SKIPPED
    tmp = Path(tempfile.mkdtemp(prefix="speclane-proxies-"))
    try:
        with signals_interrupt(), Supervisor(tmp) as sup:
            records, machine, how = _run(args, sup, tmp, nginx_bin)
    except KeyboardInterrupt:
        print("\ninterrupted; every process this benchmark started was stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs:
            print(f"logs and configs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(summary.render(records, machine, how))
    out = args.json or ROOT / "bench" / "out" / f"proxies-{_stamp()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine, "how": how, "argv": sys.argv, **report.as_json(records, [])}
    out.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    print(f"\nraw numbers: {out}")
    return 0


def _stamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def _run(
    args: argparse.Namespace, sup: Supervisor, tmp: Path, nginx_bin: str
) -> tuple[list[report.Record], str, dict[str, str]]:
    upstream, nginx = start_nginx(sup, tmp, nginx_bin, 1)
    print("starting every configuration:", flush=True)
    configs = _configs(args, sup, tmp, nginx, upstream)
    _check_all(configs)
    wrk = Wrk(sup, tmp, Wrk.find() or "wrk")
    for config in configs:  # first contact: imports, pools, caches; not measured
        for mode in config.modes:
            wrk.measure(
                config.url,
                16,
                mode == "stream",
                0,
                2,
                config.watched,
                config.models.get(mode, canned.MODEL),
            )
    others = busiest_others(sup, 3.0)
    machine = summary.machine(others)
    print(machine, flush=True)
    records = run_rounds(args, sup, wrk, configs)
    return records, machine, {c.name: c.how for c in configs}


if __name__ == "__main__":
    sys.exit(main())
