"""What ``speclane demo`` was asked to do; shared by its command line and its session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Options:
    duration: float = 60.0
    concurrency: int = 8
    agents: int = 1  # coding agents speaking /v1/messages beside the mix
    seed: int = 7
    time_scale: float = 0.25
    keep: bool = False
    json: Path | None = None
    # the sims' step-time model: measured (the H200 curve for the demo model's size), affine,
    # gpu, gpu-32b or gpu:SUMMARY.json
    cost_model: str = "measured"
