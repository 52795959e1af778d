"""The vLLM servers of a local stack: what each one runs, starting, waiting, stopping.

Each server is ``python -m vllm.entrypoints.openai.api_server`` from the cached venv, on
127.0.0.1 and a free port, in eager mode (no compile step: it starts in about half the
time), with 1 GiB of KV cache (prefix caching on, vLLM's default, and its hits reported in
chat and completions usage: ``--enable-prompt-tokens-details``), offline, without usage
reporting, and pinned to one core (``VLLM_CPU_OMP_THREADS_BIND``): left to itself every vLLM
CPU server pins core 0, and two of them on one core each run at a third of their speed.
Cores are handed out in turn.

Each server leads its own session (process group), so ``stop`` ends the API server and its
engine and worker processes together, by the PID recorded in the state file, and only after
checking that this PID still runs a vLLM server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.cli.localvllm.models import Models

K = 4
_ENTRY = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True, slots=True)
class ServerKind:
    """One kind of server: ``standard``, ``ngram`` or ``draft``."""

    name: str
    k: int | None

    def flags(self, models: Models) -> list[str]:
        if self.k is None:
            return []
        if self.name == "ngram":
            config: dict[str, object] = {
                "method": "ngram",
                "num_speculative_tokens": self.k,
                "prompt_lookup_max": 4,
            }
        else:
            config = {"method": "draft_model", "model": str(models.draft)}
            config["num_speculative_tokens"] = self.k
        return [
            "--speculative-config",
            json.dumps(config),
            "--enable-per-request-metrics",
            "--per-request-spec-decode-metrics",
            "summary",
        ]


KINDS = {
    kind.name: kind
    for kind in (ServerKind("standard", None), ServerKind("ngram", K), ServerKind("draft", K))
}


@dataclass(frozen=True, slots=True)
class Server:
    """A started server, as the state file records it."""

    name: str
    k: int | None
    pid: int
    port: int
    core: int
    log: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def argv(python: Path, kind: ServerKind, models: Models, model_name: str, port: int) -> list[str]:
    return [
        str(python),
        "-m",
        _ENTRY,
        "--model",
        str(models.target),
        "--served-model-name",
        model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--max-model-len",
        "2048",
        # a named tool_choice needs a parser; pythonic asks nothing of the tokenizer
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "pythonic",
        "--enable-prompt-tokens-details",
        *kind.flags(models),
    ]


def server_env(base: Mapping[str, str], core: int) -> dict[str, str]:
    return {
        **base,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        # vLLM keeps stored Responses (previous_response_id, GET /v1/responses/{id}) only so
        "VLLM_ENABLE_RESPONSES_API_STORE": "1",
    }


def start(argv_: list[str], env: dict[str, str], log: Path) -> int:
    """Start one server in its own session, logging to ``log``; its PID."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv_,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return process.pid


def is_vllm(pid: int) -> bool:
    """Whether ``pid`` runs a vLLM API server (and not a process that reused the PID)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return _ENTRY.encode() in cmdline and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def healthy(client: httpx.Client, server: Server) -> bool:
    try:
        return client.get(server.url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(
    servers: list[Server], timeout_s: float, progress: Callable[[str], None]
) -> list[str]:
    """Wait until every server answers ``/health``; the problems of those that did not."""
    started = time.monotonic()
    waiting = {s.name: s for s in servers}
    problems: list[str] = []
    last_note = started
    with httpx.Client(timeout=2.0) as client:
        while waiting:
            for name, server in list(waiting.items()):
                if healthy(client, server):
                    progress(
                        f"{name} ready on {server.url} after {time.monotonic() - started:.0f} s"
                    )
                    del waiting[name]
                elif not is_vllm(server.pid):
                    problems.append(f"{name} exited during start-up (log: {server.log})")
                    del waiting[name]
            elapsed = time.monotonic() - started
            if waiting and elapsed > timeout_s:
                problems += [f"{n} not ready after {timeout_s:.0f} s" for n in waiting]
                break
            if waiting and time.monotonic() - last_note >= 15:
                last_note = time.monotonic()
                progress(f"waiting for {', '.join(waiting)} ({elapsed:.0f} s)")
            time.sleep(0.5)
    return problems


def stop(server: Server, grace_s: float = 15.0) -> str:
    """Stop ``server``'s process group: SIGTERM, then SIGKILL after ``grace_s``."""
    if not is_vllm(server.pid):
        return "not running"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(server.pid):
            return "stopped"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    return "killed"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return is_vllm(pgid) or _group_has_members(pgid)


def _group_has_members(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[-1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False
