"""``bench/random_scenarios.py``: every file it writes is a scenario the replay takes, the
same seed writes the same files, and another seed other traffic."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import yaml

from gateway.replay.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from random_scenarios import scenario  # noqa: E402


def test_every_draw_is_a_scenario() -> None:
    rng = random.Random(3)
    drawn = [scenario(rng, f"r{i}") for i in range(200)]
    loaded = [load_scenario(yaml.safe_dump(d)) for d in drawn]
    assert {len(s.traffic) for s in loaded} == {2, 3, 4, 5}
    assert {t.workload for s in loaded for t in s.traffic} >= {"json", "tools", "summarise"}
    assert sum(bool(s.acceptance) for s in loaded) > 100


def test_the_same_seed_writes_the_same_files(tmp_path: Path) -> None:
    def write(seed: int, out: Path) -> list[str]:
        command = [sys.executable, "bench/random_scenarios.py", "--count", "3"]
        command += ["--seed", str(seed), "--out", str(out)]
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=60)
        return [p.read_text() for p in sorted(out.glob("*.yaml"))]

    first, again = write(5, tmp_path / "a"), write(5, tmp_path / "b")
    assert len(first) == 3 and first == again
    assert write(6, tmp_path / "c") != first
