"""``speclane sim`` from the command line: its help shows the defaults, and it says what it
serves, and where, when it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.cli.main import main
from tests.servers import free_port


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for shown in ("(default: 8101)", "(default: speculative)", "(default: 4)", "(default: vllm)"):
        assert shown in text
    assert "--zero-latency answer at once (overhead benchmarks) --drift" in text  # off: no default


def test_it_says_what_it_serves_when_it_starts() -> None:
    port = free_port()
    argv = ["sim", "--port", str(port), "--model", "tiny", "--k", "3", "--time-scale", "0.5"]
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", *argv], stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line == (
            f"speclane sim: serving tiny on http://127.0.0.1:{port} "
            "(simulated vllm, speculative decoding: draft_model, k=3, time scale 0.5)\n"
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
        assert process.stderr is not None
        process.stderr.close()
