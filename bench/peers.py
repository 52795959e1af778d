"""The proxies speclane is compared with in bench/proxies.py, each installed from PyPI into a
venv of its own and started with what it runs with by default.

- LiteLLM's proxy (``litellm[proxy]``), one worker, the upstream as an ``openai/`` model.
  Pinned to 1.82.6, the last release before the March 2026 compromise of the ``litellm``
  package on PyPI (1.82.7 and 1.82.8 carried a credential stealer); the venv is refused if it
  holds the ``.pth`` file that release planted. It runs with a bare environment: a ``PATH``,
  a scratch ``HOME``, and ``LITELLM_LOCAL_MODEL_COST_MAP`` so start-up does not wait for a
  download this machine cannot make.
- vllm-router (the vLLM project's Rust router, ``vllm-router`` on PyPI), its default policy
  (``cache_aware``), the upstream as its one worker.

Venvs live under ``~/.cache/speclane/bench/`` and are reused; a proxy that cannot be
installed or started is skipped with the reason, and the benchmark goes on without it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from procs import Child, Supervisor, free_port

CACHE = Path.home() / ".cache" / "speclane" / "bench"
LITELLM = "litellm[proxy]==1.82.6"
VLLM_ROUTER = "vllm-router==0.1.17"
_PLANTED = "litellm_init.pth"  # what the compromised 1.82.8 added to site-packages
STREAM_MODEL = "tiny-stream"  # LiteLLM's name for the upstream's streaming answer


class Skipped(Exception):
    """A proxy that cannot run here; the message says why."""


@dataclass(frozen=True, slots=True)
class Started:
    url: str
    child: Child
    how: str  # what it runs with, for the table


def venv(requirement: str, log: Path) -> Path:
    """A venv holding ``requirement``, made on first use; ``Skipped`` when pip fails."""
    name = requirement.replace("[", "-").replace("]", "").replace("==", "-")
    where = CACHE / name
    ready = where / ".installed"
    if ready.exists():
        return where
    print(f"  installing {requirement} into {where} (once)", flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(where)],
        [str(where / "bin" / "python"), "-m", "pip", "install", "-q", requirement],
    ]
    with log.open("ab") as out:
        for argv in steps:
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                raise Skipped(f"pip could not install {requirement}: {' '.join(tail)}")
    ready.touch()
    return where


def start_litellm(sup: Supervisor, tmp: Path, upstream: str) -> Started:
    where = venv(LITELLM, tmp / "litellm-install.log")
    if list(where.glob(f"lib/python*/site-packages/{_PLANTED}")):
        raise Skipped(f"{where} holds {_PLANTED}, the compromised release's payload: delete it")
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        + _litellm_model("tiny", f"{upstream}/bench-json/v1")
        + _litellm_model(STREAM_MODEL, f"{upstream}/bench-sse/v1")
    )
    home = tmp / "litellm-home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": f"{where / 'bin'}:/usr/bin:/bin",
        "HOME": str(home),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    port = free_port()
    argv = [str(where / "bin" / "litellm"), "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    child = sup.start("litellm", argv, env)
    url = f"http://127.0.0.1:{port}"
    _ready(sup, child, url + "/health/liveliness", 180)
    return Started(url, child, "litellm 1.82.6, 1 worker (its default)")


def _litellm_model(name: str, api_base: str) -> str:
    return (
        f"  - model_name: {name}\n"
        "    litellm_params:\n"
        f"      model: openai/tiny\n      api_base: {api_base}\n      api_key: none\n"
    )


def start_vllm_router(sup: Supervisor, tmp: Path, upstream: str) -> Started:
    where = venv(VLLM_ROUTER, tmp / "vllm-router-install.log")
    port = free_port()
    argv = [str(where / "bin" / "vllm-router"), "--worker-urls", upstream]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    # its Prometheus exporter takes a fixed port unless told otherwise
    argv += ["--prometheus-port", str(free_port())]
    child = sup.start("vllm-router", argv, {"PATH": f"{where / 'bin'}:/usr/bin:/bin"})
    url = f"http://127.0.0.1:{port}"
    _ready(sup, child, url + "/health", 60)
    return Started(url, child, "vllm-router 0.1.17, policy cache_aware (its default)")


def _ready(sup: Supervisor, child: Child, url: str, timeout_s: float) -> None:
    try:
        sup.wait_ready(child, url, timeout_s)
    except RuntimeError as exc:
        sup.stop(child)
        raise Skipped(str(exc).splitlines()[0]) from None
