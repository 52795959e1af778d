"""``speclane demo`` end to end through the real CLI: a twelve-second run at a small time scale
starts both simulated pools and the gateway, serves every workload, shows the code slice
falling back when its acceptance collapses, writes the JSON summary, and leaves no process
behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = {"json", "tools", "code", "chat", "creative", "summarise"}


def closed(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) != 0


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.long(19)
def test_short_demo_run(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    # At a twentieth of real time the simulators' steps take a millisecond or two, and the
    # machine's CPU, not the model, sets their times: speculation's extra cost per step
    # shrinks into noise and the collapse may not cost enough to show. A tenth keeps the
    # model in charge.
    argv = ["demo", "--duration", "12", "--time-scale", "0.1", "--concurrency", "8"]
    done = subprocess.run(
        [sys.executable, "-m", "gateway", *argv, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for title in ("Pilot report", "(c) What the routing cost", "(d) shadow"):
        assert title in done.stdout
    assert "chat / " in done.stdout

    summary = json.loads(out.read_text())
    rows = {row["workload"]: row for row in summary["workloads"]}
    assert set(rows) == WORKLOADS
    assert all(row["requests"] > 0 and row["errors"] == 0 for row in rows.values()), rows
    assert rows["json"]["spec_share"] == 1.0 and rows["summarise"]["spec_share"] == 0.0
    assert rows["json"]["mean_acceptance_length"] > 3
    assert {row["workload"] for row in summary["replay"]} == WORKLOADS | {"all"}
    everything = next(row for row in summary["replay"] if row["workload"] == "all")["decode_cost_s"]
    assert everything["oracle"] <= min(everything["speculative"], everything["standard"])

    events = summary["guardrail_events"]
    assert isinstance(events, list)
    assert "collapse" in summary["drift"]
    falls = [e for e in events if e["to_phase"] == "fallen_back"]
    assert falls and falls[0]["slice"].startswith("code / "), events
    assert summary["drift"]["collapse"] < falls[0]["at_s"] < summary["drift"]["recover"]
    assert summary["shadow"]["creative_requests"] == rows["creative"]["requests"]
    chat = [a for a in summary["pilot"]["arms"] if a["slice"].startswith("chat / ")]
    assert {a["arm"] for a in chat} == {"spec", "standard"}, chat  # the pilot's two arms
    rules = {v["slice"].split(" / ")[0] for v in summary["pilot"]["verdicts"]}
    assert rules >= {"chat", "structured-json", "code"}

    for child in summary["stack"].values():
        assert closed(child["url"]), child
        assert gone(child["pid"]), child
