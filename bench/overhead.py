"""How much latency and throughput speclane costs over talking to the upstream directly.

Three configurations against one canned upstream that is never the bottleneck:

  direct    load generator -> upstream
  bare      load generator -> bench/bare_proxy.py (same stack, relays bytes) -> upstream
  speclane  load generator -> speclane serve (parse, classify, decide, measure) -> upstream

at each concurrency, streaming and not, interleaved and repeated in rounds. The upstream is
nginx serving vLLM-shaped answers from memory (bench/canned.py, bench/nginx.conf.tmpl), or
with ``--upstream sim`` the simulator in zero-latency mode. Every server runs in its own
process; the load generator (wrk, else bench/loadgen.py) too. Each process is stopped on
exit, Ctrl-C included. The table goes to stdout; raw numbers to ``--json``.

    .venv/bin/python bench/overhead.py --duration 5 --rounds 3

Needs nginx for the default upstream (Debian/Ubuntu: ``apt-get install nginx-light``);
without it the benchmark is skipped with a message. wrk (``apt-get install wrk``) is used
when installed: it takes less CPU per request than the Python load generator.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import os
import platform
import pwd
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import canned
import orjson
import report
from loaders import OTHER, Measurement, PythonLoader, Wrk
from procs import (
    Child,
    Supervisor,
    cpu_model,
    cpu_snapshot,
    free_port,
    others_s,
    signals_interrupt,
)

CHAT = "/v1/chat/completions"
ROOT = Path(__file__).resolve().parent.parent
SKIPPED = 0  # exit status when nginx is missing: skipped, not failed
_POLICY = """\
version: 1
pools:
  spec:
    kind: speculative
    model: {model}
    num_speculative_tokens: 4
    endpoints: [{url}]
    passthrough_non_streaming: {passthrough}
  standard:
    kind: standard
    model: {model}
    endpoints: [{url}]
    passthrough_non_streaming: {passthrough}
ladder: [spec, standard]
{guardrail}rules:
  - name: structured
    match:
      response_format: [json_object, json_schema]
      temperature: {{max: 0.5}}
    start: spec
  - name: long-context
    match:
      context_tokens: {{min: 16000}}
    start: standard
  - name: default
    start: spec
"""
THRESHOLDS = """\
guardrail:
  min_acceptance: 0.3
  recover_above: 0.4
  min_samples: 30
  window_s: 60
  cooldown_s: 30
"""


def policy_text(url: str, *, passthrough: bool = True, guardrail: str = THRESHOLDS) -> str:
    """The benchmark's policy: three rules, both pools at ``url``; ``guardrail`` "" for the
    default one."""
    flag = "true" if passthrough else "false"
    return _POLICY.format(model=canned.MODEL, url=url, passthrough=flag, guardrail=guardrail)


Cell = tuple["Target", int, bool]  # where, concurrency, streaming
Measure = Callable[["Target", int, bool, float, float], Measurement]


@dataclass(frozen=True, slots=True)
class Target:
    """Where the load generator sends a configuration's requests, and whose CPU to watch."""

    name: str
    url: str
    watched: dict[str, Child]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/overhead.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--duration",
        type=float,
        default=5.0,
        metavar="S",
        help="measured seconds per cell (default 5; wrk rounds to whole seconds)",
    )
    add(
        "--warmup",
        type=float,
        default=1.0,
        metavar="S",
        help="unmeasured seconds of the same load before each measured one (default 1)",
    )
    add(
        "--rounds",
        type=int,
        default=3,
        metavar="N",
        help="measure every cell N times, "
        "rotating the order of the configurations; medians are reported (default 3)",
    )
    add(
        "--concurrency",
        default="1,16,64",
        metavar="LIST",
        help="connections, comma-separated (default 1,16,64)",
    )
    add(
        "--modes",
        default="stream,json",
        metavar="LIST",
        help="stream (SSE) and/or json (non-streaming) requests (default stream,json)",
    )
    add(
        "--configs",
        default="direct,bare,speclane",
        metavar="LIST",
        help="configurations to "
        "run (default direct,bare,speclane; added latency needs direct, %% of bare needs bare)",
    )
    add(
        "--upstream",
        choices=("nginx", "sim"),
        default="nginx",
        help="canned upstream: nginx "
        "(default), or the simulator with --zero-latency, which on 2 cores is only about 4x "
        "faster than speclane and so competes with it for CPU",
    )
    add(
        "--loader",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="load generator: "
        "wrk, or bench/loadgen.py (aiohttp); auto takes wrk when installed (default)",
    )
    add("--nginx", metavar="PATH", help="nginx binary (default: nginx on PATH, or in /usr/sbin)")
    add(
        "--nginx-workers",
        type=int,
        default=1,
        metavar="N",
        help="nginx worker processes (default 1)",
    )
    add(
        "--quiet-below",
        type=float,
        default=25.0,
        metavar="PCT",
        help="CPU %% used by "
        "processes outside this benchmark that counts as a busy machine: wait for less before "
        "each cell, and measure a cell again if it saw more (default 25)",
    )
    add(
        "--patience",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to wait for a quiet machine before measuring anyway (default 30)",
    )
    add(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="extra tries of a cell measured on "
        "a busy machine; the quietest try is kept (default 2)",
    )
    add(
        "--json",
        type=Path,
        metavar="PATH",
        help="write every measurement here (default bench/out/overhead-<time>.json)",
    )
    add(
        "--report",
        type=Path,
        metavar="PATH",
        help="measure nothing: print the table and targets again from a file --json wrote",
    )
    add(
        "--keep-logs",
        action="store_true",
        help="keep the temp dir with the generated nginx "
        "config, policy, wrk scripts and each server's log",
    )
    return parser


def _find_nginx(given: str | None) -> str | None:
    if given:
        return shutil.which(given)
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")


def _nginx_user() -> str:
    """As root, nginx workers must drop to someone; as anyone else they stay themselves."""
    if os.geteuid() != 0:
        return "# not root: workers run as the current user"
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        return "user root;"
    import grp

    return f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};"


def start_nginx(sup: Supervisor, tmp: Path, nginx: str, workers: int) -> tuple[str, Child]:
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(canned.nginx_config(nginx, port, tmp, _nginx_user(), workers))
    argv = [nginx, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")]
    child = sup.start("nginx", argv)
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, url + "/healthz")
    return url, child


def start_sim(sup: Supervisor) -> tuple[str, Child]:
    port = free_port()
    argv = [*_speclane(), "sim", "--zero-latency", "--mode", "speculative"]
    argv += ["--port", str(port), "--model", canned.MODEL]
    child = sup.start("sim", argv)
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, url + "/v1/models")
    return url, child


def start_bare(sup: Supervisor, upstream: str) -> tuple[str, Child]:
    port = free_port()
    script = Path(__file__).with_name("bare_proxy.py")
    argv = [sys.executable, str(script), "--upstream", upstream, "--port", str(port)]
    child = sup.start("bare", argv)
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, url + "/healthz")
    return url, child


def start_speclane(sup: Supervisor, tmp: Path, upstream: str) -> tuple[str, Child]:
    port = free_port()
    policy = tmp / "policy.yaml"
    policy.write_text(policy_text(upstream))
    argv = [*_speclane(), "serve", "--policy", str(policy), "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    env["SPECLANE_LOG_LEVEL"] = "warning"
    child = sup.start("speclane", argv, env)
    url = f"http://127.0.0.1:{port}"
    sup.wait_ready(child, url + "/healthz")
    return url, child


def _speclane() -> list[str]:
    script = Path(sys.executable).with_name("speclane")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]


def _post(url: str, stream: bool, model: str) -> tuple[int, dict[str, str], bytes]:
    host_port = url.removeprefix("http://").split("/")[0]
    host, _, port = host_port.partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        body = canned.request_body(stream, model, canned.route_of(url))
        path = "/" + url.removeprefix("http://").split("/", 1)[1]
        connection.request("POST", path, body, canned.request_headers(stream))
        response = connection.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        connection.close()


def check(url: str, name: str, stream: bool, model: str = canned.MODEL) -> str:
    """One request by hand: the answer must be complete before anything is timed."""
    status, headers, body = _post(url, stream, model)
    where = f"{name} ({'stream' if stream else 'json'})"
    if status != 200:
        raise RuntimeError(f"{where} answered {status}: {body[:300]!r}")
    route = canned.route_of(url)
    if route != "chat":  # relayed as they came: the upstream's own bytes
        canned_answer = canned.sse_body(route) if stream else canned.json_body(route)
        if body != canned_answer:
            raise RuntimeError(f"{where}: not the upstream's answer byte for byte: {body[:300]!r}")
        detail = f"{body.count(b'data: ')} events" if stream else "JSON"
        detail += f", {len(body)} bytes, the upstream's own"
    elif stream:
        events = [b for b in body.split(b"\n\n") if b.startswith(b"data: ")]
        if not body.endswith(b"data: [DONE]\n\n"):
            raise RuntimeError(f"{where}: the stream did not end with [DONE]")
        detail = f"{len(events)} events, {len(body)} bytes"
    else:
        answer = orjson.loads(body)
        if not answer["choices"][0]["message"]["content"]:
            raise RuntimeError(f"{where}: no content in {body[:300]!r}")
        detail = f"JSON, {len(body)} bytes"
    if "x-speclane-pool" in headers:
        detail += f", rule {headers['x-speclane-rule']} -> pool {headers['x-speclane-pool']}"
    return f"  {where}: {detail}"


def _loader(choice: str, sup: Supervisor, tmp: Path) -> Wrk | PythonLoader:
    wrk = Wrk.find()
    if choice == "wrk" and wrk is None:
        raise SystemExit("--loader wrk: wrk is not installed (apt-get install wrk)")
    if choice in ("auto", "wrk") and wrk is not None:
        return Wrk(sup, tmp, wrk)
    return PythonLoader(sup)


def _line(rec: report.Record) -> str:
    m = rec.measurement
    cpu = " ".join(f"{role} {p:.0f}%" for role in m.cpu_s if (p := m.cpu_percent(role)) is not None)
    errors = f"  ERRORS {m.errors}" if m.errors else ""
    return (
        f"  {rec.config:<9} {m.rps:8,.0f} req/s  p50 {m.p50_us / 1e3:7.2f} ms  "
        f"p99 {m.p99_us / 1e3:7.2f} ms  ({m.requests} req; cpu {cpu}){errors}"
    )


def other_load(sup: Supervisor, seconds: float = 0.5) -> float:
    """CPU % that processes not of this benchmark used over ``seconds``."""
    before = cpu_snapshot()
    time.sleep(seconds)
    return 100 * others_s(before, cpu_snapshot(), sup.groups, 0.0) / seconds


def wait_quiet(sup: Supervisor, below: float, patience_s: float) -> None:
    """Wait (at most ``patience_s``) until other processes leave the CPU to the benchmark."""
    deadline = time.monotonic() + patience_s
    while (load := other_load(sup)) >= below:
        if time.monotonic() >= deadline:
            print(f"  (the rest of the machine still uses {load:.0f} % CPU; measuring anyway)")
            return


def _measure_quietly(
    args: argparse.Namespace, sup: Supervisor, measure: Measure, cell: Cell
) -> Measurement:
    """Measure once the machine is quiet; again (up to ``--retries``) if it got busy."""
    best: Measurement | None = None
    for attempt in range(args.retries + 1):
        wait_quiet(sup, args.quiet_below, args.patience)
        m = measure(*cell, args.warmup, args.duration)
        if best is None or m.cpu_s.get(OTHER, 0) < best.cpu_s.get(OTHER, 0):
            best = m
        busy = m.cpu_percent(OTHER) or 0.0
        if busy < args.quiet_below:
            break
        if attempt < args.retries:
            print(f"  ({cell[0].name}: other processes used {busy:.0f} % CPU; measuring again)")
    assert best is not None
    return best


def run_rounds(
    args: argparse.Namespace, sup: Supervisor, targets: list[Target], measure: Measure
) -> list[report.Record]:
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    records = []
    for r in range(args.rounds):
        for concurrency in concurrencies:
            for mode in modes:
                print(f"round {r + 1}/{args.rounds}  concurrency {concurrency}  {mode}")
                shift = r % len(targets)  # rotate the order so no one always goes first
                for target in targets[shift:] + targets[:shift]:
                    cell = (target, concurrency, mode == "stream")
                    m = _measure_quietly(args, sup, measure, cell)
                    rec = report.Record(r, target.name, concurrency, mode, m)
                    print(_line(rec), flush=True)
                    records.append(rec)
    return records


def _machine(loader: str, upstream: str) -> str:
    return (
        f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; load generator {loader}; upstream {upstream}"
    )


def _spend(args: argparse.Namespace, configs: int) -> float:
    cells = len(args.concurrency.split(",")) * len(args.modes.split(",")) * configs
    seconds: float = args.rounds * cells * (args.duration + args.warmup + 1.0)
    return seconds


def _speclane_recorded(url: str) -> str:
    """Requests speclane's own metrics counted: proof that measurement was on."""
    host, _, port = url.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    total = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("speclane_requests_total{")
    )
    return f"speclane recorded {total:,.0f} finished requests in its metrics"


def _summary(records: list[report.Record], info: str) -> None:
    table = report.rows(records)
    print("\n" + info + "\n")
    print(report.markdown(table))
    for text, met in report.targets(table):
        print(f"  {'MET    ' if met else 'NOT MET'}  {text}")


def main() -> int:
    args = _parser().parse_args()
    if args.report:
        data = orjson.loads(args.report.read_bytes())
        _summary(report.from_json(data), data["machine"])
        return 0
    names = [c.strip() for c in args.configs.split(",")]
    nginx = _find_nginx(args.nginx)
    if args.upstream == "nginx" and nginx is None:
        print(
            "SKIPPED: nginx is not installed, and the default upstream is nginx.\n"
            "  Debian/Ubuntu: sudo apt-get install nginx-light   (or nginx)\n"
            "  or run against the simulator instead: --upstream sim",
            file=sys.stderr,
        )
        return SKIPPED
    tmp = Path(tempfile.mkdtemp(prefix="speclane-overhead-"))
    records: list[report.Record] = []
    try:
        with signals_interrupt(), Supervisor(tmp) as sup:
            records, info = _run(args, names, sup, tmp, nginx)
    except KeyboardInterrupt:
        print("\ninterrupted; every process this benchmark started was stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs:
            print(f"logs and configs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    _summary(records, info)
    table = report.rows(records)
    out = args.json or ROOT / "bench" / "out" / f"overhead-{_stamp()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(
        orjson.dumps(
            {"machine": info, "argv": sys.argv, **report.as_json(records, table)},
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"\nraw numbers: {out}")
    return 0


def _stamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def _run(
    args: argparse.Namespace, names: list[str], sup: Supervisor, tmp: Path, nginx: str | None
) -> tuple[list[report.Record], str]:
    if args.upstream == "nginx":
        assert nginx is not None
        upstream, upstream_child = start_nginx(sup, tmp, nginx, args.nginx_workers)
    else:
        upstream, upstream_child = start_sim(sup)
    targets = []
    for name in names:
        if name == report.DIRECT:
            targets.append(Target(name, upstream + CHAT, {"upstream": upstream_child}))
        elif name == report.BARE:
            url, child = start_bare(sup, upstream)
            targets.append(Target(name, url + CHAT, {"proxy": child, "upstream": upstream_child}))
        elif name == report.SPECLANE:
            url, child = start_speclane(sup, tmp, upstream)
            targets.append(Target(name, url + CHAT, {"proxy": child, "upstream": upstream_child}))
        else:
            raise SystemExit(f"unknown configuration {name!r}")
    loader = _loader(args.loader, sup, tmp)
    upstream_name = f"nginx ({nginx})" if args.upstream == "nginx" else "simulator, zero-latency"
    info = _machine(loader.name, upstream_name)
    print(info)
    print(f"about {_spend(args, len(targets)) / 60:.0f} min; checking every configuration:")
    for target in targets:
        for stream in (True, False):
            print(check(target.url, target.name, stream))

    def measure(t: Target, concurrency: int, stream: bool, warm: float, dur: float) -> Measurement:
        return loader.measure(t.url, concurrency, stream, warm, dur, t.watched)

    for target in targets:  # first contact: imports, pools, caches; not measured
        measure(target, 16, True, 0, 2)
    records = run_rounds(args, sup, targets, measure)
    speclane = next((t for t in targets if t.name == report.SPECLANE), None)
    if speclane is not None:
        info += "\n" + _speclane_recorded(speclane.url.removesuffix(CHAT))
    return records, info


if __name__ == "__main__":
    sys.exit(main())
