"""The files ``up`` leaves in the run directory: ``state.json`` (what runs where, read by
``status``, ``down`` and the vLLM test tier) and ``policy.yaml`` (a policy for
``speclane serve`` that points at the servers)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gateway.cli.localvllm.servers import Server

STATE = "state.json"
POLICY = "policy.yaml"


@dataclass(frozen=True, slots=True)
class StackState:
    model: str
    venv: str
    target: str
    draft: str
    policy: str
    servers: list[Server] = field(default_factory=list)

    def server(self, name: str) -> Server | None:
        return next((s for s in self.servers if s.name == name), None)

    def save(self, run_dir: Path) -> None:
        path = run_dir / STATE
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(asdict(self), indent=2) + "\n")
        partial.replace(path)

    @classmethod
    def load(cls, run_dir: Path) -> StackState | None:
        try:
            raw = json.loads((run_dir / STATE).read_text())
        except (OSError, ValueError):
            return None
        servers = [Server(**s) for s in raw.pop("servers", [])]
        return cls(**raw, servers=servers)


def policy_text(state: StackState) -> str:
    """Speculative pools first, then standard; the endpoint header picks a pool directly."""
    lines = ["version: 1", "pools:"]
    names = [s.name for s in state.servers]
    for server in state.servers:
        kind = "speculative" if server.k else "standard"
        k = f", num_speculative_tokens: {server.k}" if server.k else ""
        lines.append(
            f"  {server.name}: {{kind: {kind}, model: {state.model}{k}, endpoints: [{server.url}]}}"
        )
    ladder = [n for n in names if n != "standard"] + (["standard"] if "standard" in names else [])
    lines.append(f"ladder: [{', '.join(ladder)}]")
    lines.append("rules:")
    for name in ladder:
        lines.append(f"  - {{name: {name}, match: {{endpoint: [{name}]}}, start: {name}}}")
    lines.append(f"  - {{name: default, start: {ladder[0]}}}")
    return "\n".join(lines) + "\n"
