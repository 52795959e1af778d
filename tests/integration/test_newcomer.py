"""The README's quick start, followed as written, as a newcomer would.

A wheel of this repository (``pip wheel --no-deps``) goes into a fresh virtual environment
with its dependencies at the pinned versions (``-c constraints.txt``, from pip's cache) and
the ``openai`` client. Then every README block that is not marked ``{not-run}`` runs, in
order, in a shell whose ``PATH`` starts with that environment: the GPU-free line that starts
two simulators (``speclane sim``, one speculative, one standard) where the README's vLLM
servers would be (each command before a ``&`` started in the background, as the shell
would), ``speclane init``, ``speclane serve`` (started in the background, as the README says
it stays in the foreground), the ``curl`` and ``openai`` requests (the routing headers
checked), ``speclane policy lint`` and ``speclane flags list``; then the gateway is stopped
with SIGTERM and must exit 0. The only change made to the blocks is the addresses
(``addresses``). ``tests/test_docs.py`` checks that every other README block is marked.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
MODEL = "Qwen/Qwen3-8B"  # what the README's vLLM servers serve
FENCE = re.compile(r"^```(\S*)(.*)$")


@dataclass(frozen=True, slots=True)
class Block:
    lang: str
    marked: bool  # info string says {not-run}
    text: str
    line: int


def blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, with its language and mark."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body = "\n".join(lines[i + 1 : end])
        out.append(Block(opened[1], "{not-run}" in opened[2], body, i + 1))
        i = end + 1
    return out


def quick_start(text: str) -> list[Block]:
    """The blocks this test runs: every one not marked ``{not-run}``."""
    return [block for block in blocks(text) if not block.marked]


def commands(block: Block) -> Iterator[str]:
    """A shell block's commands: continued lines joined, comments and blanks left out."""
    for command in block.text.replace("\\\n", " ").splitlines():
        if command.strip() and not command.lstrip().startswith("#"):
            yield command


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the repository's wheel in it; its ``bin``."""
    where = tmp_path_factory.mktemp("newcomer")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run([*pip, "wheel", "--no-deps", "-w", str(where / "wheel"), str(ROOT)])
    run([sys.executable, "-m", "venv", "--without-pip", str(where / "venv")])
    [wheel] = (where / "wheel").glob("speclane-*.whl")
    python = where / "venv" / "bin" / "python"
    constraints = str(ROOT / "constraints.txt")
    into = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    run([*into, "install", "-q", "--no-compile", "-c", constraints, str(wheel), "openai"])
    return python.parent


def run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"


def wait_for(url: str, process: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer"
        time.sleep(0.1)


@pytest.mark.long(40)
@pytest.mark.timeout(900)
def test_the_readme_quick_start_as_written(fresh: Path, tmp_path: Path) -> None:
    spec, std, gateway = free_port(), free_port(), free_port()
    addresses = {
        "localhost:8001": f"127.0.0.1:{spec}",
        "localhost:8002": f"127.0.0.1:{std}",
        "localhost:8080": f"127.0.0.1:{gateway}",
        "--port 8080": f"--port {gateway}",
        "--port 8001": f"--port {spec}",
        "--port 8002": f"--port {std}",
    }
    text = README.read_text()
    for written in addresses:
        assert written in text, f"the README no longer says {written}"
    env = {"PATH": f"{fresh}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    sims: list[subprocess.Popen[str]] = []
    said: dict[str, str] = {}
    served: subprocess.Popen[str] | None = None
    try:
        for block in quick_start(text):
            body = block.text
            for written, ours in addresses.items():
                body = body.replace(written, ours)
            if block.lang == "python":
                said["python"] = _ran([str(fresh / "python"), "-c", body], tmp_path, env)
                continue
            assert block.lang == "sh", f"README line {block.line}: cannot run {block.lang!r}"
            for command in commands(Block(block.lang, False, body, block.line)):
                if command.startswith("speclane sim"):
                    assert command.count(f"--model {MODEL} ") == 2, command  # the vLLM's model
                    sims += _in_background(command, tmp_path, env)
                    for sim, port in zip(sims, (spec, std), strict=True):
                        wait_for(f"http://127.0.0.1:{port}/v1/models", sim)
                    continue
                if "speclane serve" in command:
                    served = subprocess.Popen(  # bash runs one command in its own place
                        ["bash", "-c", command], cwd=tmp_path, env=env, text=True,
                        stderr=subprocess.PIPE,
                    )  # fmt: skip
                    wait_for(f"http://127.0.0.1:{gateway}/readyz", served)
                    continue
                said[_step(command)] = _ran(["bash", "-c", command], tmp_path, env)
        assert served is not None, "the quick start never starts the gateway"
        served.send_signal(signal.SIGTERM)
        _, log = served.communicate(timeout=60)
        assert served.returncode == 0, log
    finally:
        for process in [*sims, *([served] if served else [])]:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    _check(said, log)


def _in_background(command: str, cwd: Path, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    """Each command of ``a & b &``, started in the background as the shell would."""
    parts = [part.strip() for part in command.split("&")]
    assert parts[-1] == "" and all(parts[:-1]), f"not a line of background commands: {command}"
    return [
        subprocess.Popen(
            ["bash", "-c", f"exec {part}"], cwd=cwd, env=env, stderr=subprocess.DEVNULL, text=True
        )
        for part in parts[:-1]
    ]


def _step(command: str) -> str:
    """A command's name for the checks: ``curl``, ``speclane policy lint``, ..."""
    words = command.split()
    return " ".join(words[:3]) if words[0] == "speclane" else words[0]


def _ran(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv[-1]}\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def _check(said: dict[str, str], log: str) -> None:
    """What each step of the quick start must have shown."""
    init = said["speclane init --spec"]
    assert "(spec): vllm, speculative, k=4" in init and "(standard): vllm, standard" in init
    assert "wrote policy.yaml (it lints clean)" in init and "check:" not in init
    curl = said["curl"]
    assert curl.startswith("HTTP/1.1 200") and "x-speclane-pool: " in curl.lower()
    pool, reason = said["python"].strip().split(" | ")
    assert pool in ("spec", "standard") and reason
    assert said["speclane policy lint"].strip().endswith("policy.yaml: 0 error(s), 0 warning(s)")
    flags = said["speclane flags list"].splitlines()
    assert flags[0].split("\t") == ["flag", "enabled", "rollout", "tenants", "source", "rules"]
    assert any(line.startswith("speculation\ton\t") for line in flags[1:])
    assert "policy policy.yaml (version " in log and "pool spec: speculative k=4 on vllm" in log
