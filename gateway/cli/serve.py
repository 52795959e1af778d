"""``speclane serve``: run the gateway, as one process or as ``--workers N``
(``gateway/cli/workers.py``).

Command-line edge only: settings from options and the environment, the policy file, then
the server. A bad setting or a policy that does not load is one clear message and exit
code 2 or 1, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from gateway.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
WORKER_LOG_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
TRACE = 5  # uvicorn's level below DEBUG


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser("serve", help="run the gateway")
    serve.add_argument("--policy", type=Path, help="policy file (or SPECLANE_POLICY)")
    serve.add_argument("--host", help="listen address (or SPECLANE_HOST)")
    serve.add_argument("--port", type=int, help="listen port (or SPECLANE_PORT)")
    serve.add_argument("--redis-url", help="share state through Redis (or SPECLANE_REDIS_URL)")
    serve.add_argument(
        "--workers",
        help="processes serving the port, a number or auto; more than one needs Redis "
        "(or SPECLANE_WORKERS; default 1)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        default=None,
        help="log one line per request (or SPECLANE_ACCESS_LOG=true)",
    )
    serve.add_argument(
        "--log-level", help="trace, debug, info, warning or error (or SPECLANE_LOG_LEVEL)"
    )
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gateway.settings import Settings
    from gateway.state.policyfile import PolicyHolder
    from policies.problems import PolicyError

    overrides = {
        key: value
        for key, value in {
            "policy": args.policy,
            "host": args.host,
            "port": args.port,
            "redis_url": args.redis_url,
            "workers": args.workers,
            "access_log": args.access_log,
            "log_level": args.log_level,
        }.items()
        if value is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        sys.stderr.write(settings_errors(exc))
        return 2
    settings = _resolve_workers(settings)
    logging.addLevelName(TRACE, "TRACE")
    fmt = WORKER_LOG_FORMAT if settings.several_workers else LOG_FORMAT
    logging.basicConfig(level=settings.log_level.upper(), format=fmt)
    try:
        holder = PolicyHolder.from_file(settings.policy)  # one that does not load: say so here
    except PolicyError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"cannot read the policy {settings.policy}: {exc.strerror or exc}\n")
        return 1
    from gateway.cli.loaded import loaded_lines
    from gateway.cli.workers import bind

    try:  # before anything is said of what would be served: a taken port is one line
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        where = f"{settings.host}:{settings.port}"
        sys.stderr.write(f"speclane serve: cannot listen on {where}: {exc.strerror or exc}\n")
        return 1

    for line in loaded_lines(settings, holder.current, holder.version):
        logging.getLogger(__name__).info("%s", line)
    if settings.several_workers:
        return _several(settings, sock)
    return _serve(settings, sock)


def _resolve_workers(settings: Settings) -> Settings:
    """``auto``: one worker per CPU the process may use when Redis is set, else one."""
    if settings.workers != "auto":
        return settings
    from gateway.cli.workers import cpus

    count = cpus() if settings.redis_url else 1
    if count == 1 and settings.redis_url is None and cpus() > 1:
        logging.getLogger(__name__).warning(
            "SPECLANE_WORKERS=auto: one worker, since without SPECLANE_REDIS_URL several "
            "could not share flags, windows and guardrail states"
        )
    return settings.model_copy(update={"workers": count})


def _several(settings: Settings, sock: socket.socket) -> int:
    from prometheus_client.multiprocess import mark_process_dead

    from gateway.cli.workers import Workers
    from gateway.settings import export_metrics_dir

    made = settings.metrics_dir is None
    metrics = settings.metrics_dir or Path(tempfile.mkdtemp(prefix="speclane-metrics-"))
    for stale in metrics.glob("*.db"):  # counts of an earlier run would add up with ours
        stale.unlink()
    export_metrics_dir(metrics)
    settings = settings.model_copy(update={"metrics_dir": metrics})
    assert isinstance(settings.workers, int)
    workers = Workers(
        settings.workers,
        sock,
        functools.partial(_worker, settings),
        grace_s=settings.drain_delay_s + settings.graceful_shutdown_s,
        on_exit=functools.partial(mark_process_dead, path=str(metrics)),
    )
    logging.getLogger(__name__).info(
        "speclane on http://%s:%d with %d workers", settings.host, settings.port, settings.workers
    )
    try:
        return workers.serve()
    finally:
        if made:
            shutil.rmtree(metrics, ignore_errors=True)


def _worker(settings: Settings, sock: socket.socket) -> int:
    """One of several workers, in its own process: the app, served on the shared socket."""
    from gateway.measure.telemetry import share_between_processes

    share_between_processes()
    return _serve(settings, sock)


def _serve(settings: Settings, sock: socket.socket | None = None) -> int:
    """The app under uvicorn until a graceful stop (``gateway/server/shutdown.py``)."""
    import uvicorn

    from gateway.server.app import build_services, create_app
    from gateway.server.shutdown import DrainingServer

    services = build_services(settings)
    app = create_app(settings, services)
    _tune_gc()
    config = uvicorn.Config(app, **_uvicorn_options(settings))
    server = DrainingServer(config, services.gate, settings.drain_delay_s)
    server.run(sockets=None if sock is None else [sock])
    return 0 if server.started else 1


def _uvicorn_options(settings: Settings) -> dict[str, Any]:
    from gateway.server.connections import server_options

    fmt = WORKER_LOG_FORMAT if settings.several_workers else LOG_FORMAT
    return {
        **server_options(settings),
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "log_level": settings.log_level,
        "access_log": settings.access_log,
        "log_config": _uvicorn_logging(settings.log_level, fmt),
        "timeout_graceful_shutdown": int(settings.graceful_shutdown_s),
    }


def settings_errors(exc: ValidationError) -> str:
    """One line per bad setting, named as the operator set it."""
    lines = []
    for error in exc.errors(include_url=False):
        name = "_".join(str(part) for part in error["loc"]).upper()
        value = error.get("input")
        got = f" (got {value!r})" if isinstance(value, str | int | float) else ""
        lines.append(f"speclane serve: SPECLANE_{name}: {error['msg']}{got}\n")
    return "".join(lines)


def _uvicorn_logging(level: str, fmt: str = LOG_FORMAT) -> dict[str, object]:
    """uvicorn's own loggers (start-up, errors, the access log) in the gateway's format,
    with timestamps."""
    handler = {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": fmt}},
        "handlers": {"default": handler},
        "loggers": {
            name: {"handlers": ["default"], "level": level.upper(), "propagate": False}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def _tune_gc() -> None:
    """Freeze what start-up allocated and collect the young generation less often: a
    request creates no reference cycles, and at the default threshold the collector ran
    ~200 times a second under load, with full passes pausing for tens of milliseconds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
