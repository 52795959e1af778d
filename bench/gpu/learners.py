"""The guardrail's step-time learners (``policies/steptime.py``) against a measured step-time
table (``steptime.py``'s CSV): how far each shape's prediction lands from the measured step.

    .venv/bin/python bench/gpu/learners.py [bench/gpu/results/h200-8b-32b/steptime.csv]

A pool's step at batch B is the measured forward: a standard pool's plain step (q = 1), an
n-gram pool's k=4 verification (q = 5, drafts free), a draft-model pool's verification plus
four passes of the draft. Each pool's learner is fed 40 observations at each batch it sees,
with 3% of Gaussian noise (seeded), and asked at each measured batch. Printed, as Markdown:

1. seen at B = 1..128: the largest miss (prediction over measurement, less 1) over those
   batches, for each pool and for each speculative pool's step over the standard pool's at
   the same batch (the ratio the guardrail judges), per target, context and learner;
2. seen at B = 1..16 only, asked at 32, 64 and 128: prediction over measurement (both
   learners give the same line there: no observation shows a knee).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stepcurve as sc

from policies.steptime import HingeFit, StepFit

RESULTS = Path(__file__).resolve().parent / "results" / "h200-8b-32b" / "steptime.csv"
K = 4
POOLS = ("standard", "ngram", "draft")
RATIOS = ("ngram", "draft")
SPREAD = (1, 2, 4, 8, 16, 32, 64, 128)
SMALL = (1, 2, 4, 8, 16)
ASKED = (32, 64, 128)
NOISE = 0.03
PER_BATCH = 40

Fit = StepFit | HingeFit
Step = Callable[[str, int], float | None]


def pool_steps(tab: sc.Table, shape: str, draft: str, context: int) -> Step:
    def step(pool: str, batch: int) -> float | None:
        plain = tab.get((shape, "target", context, batch, 1))
        verify = tab.get((shape, "target", context, batch, K + 1))
        if pool == "standard":
            return plain
        if pool == "ngram" or verify is None:
            return verify
        one = tab.get((draft, "draft", context, batch, 1))
        return None if one is None else verify + K * one

    return step


def fed(
    kind: type[StepFit] | type[HingeFit], step: Step, pool: str, batches: tuple[int, ...]
) -> Fit:
    fit = kind(tokens_per_seq=1 if pool == "standard" else K + 1)
    rng = random.Random(0)
    seen = [b for b in batches if step(pool, b) is not None]
    for i in range(PER_BATCH * len(seen)):
        batch = seen[i % len(seen)]
        ms = step(pool, batch)
        assert ms is not None
        fit.add(i * 0.01, batch, ms / 1e3 * (1 + rng.gauss(0, NOISE)))
    return fit


def over(fits: dict[str, Fit], step: Step, what: str, batch: int) -> float | None:
    """Prediction over measurement at ``batch`` of a pool, or of ``X/standard``."""

    def predicted(pool: str) -> float:
        got = fits[pool].predict(fits[pool].at, batch)  # right after the last observation
        assert got is not None
        return got.seconds * 1e3

    pool, _, base = what.partition("/")
    measured, below = step(pool, batch), step(base, batch) if base else 1.0
    if measured is None or below is None:
        return None
    if not base:
        return predicted(pool) / measured
    return predicted(pool) / predicted(base) / (measured / below)


def worst(fits: dict[str, Fit], step: Step, what: str, batches: tuple[int, ...]) -> str:
    misses = [(r - 1, b) for b in batches if (r := over(fits, step, what, b)) is not None]
    if not misses:
        return "-"
    miss, batch = max(misses, key=lambda m: abs(m[0]))
    return f"{miss:+.0%} (B={batch})"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else RESULTS
    cells = sc.read_cells(str(path))
    tab = sc.table(cells)
    shapes = [s for s in dict.fromkeys(c.shape for c in cells if c.role == "target")]
    draft = next((c.shape for c in cells if c.role == "draft"), "")
    whats = [*POOLS, *(f"{p}/standard" for p in RATIOS)]
    print(f"Seen at B = {SPREAD[0]}..{SPREAD[-1]}: the largest miss over those batches\n")
    print("| target | context | learner | " + " | ".join(whats) + " |")
    print("| --- " * (3 + len(whats)) + "|")
    second = []
    for shape in shapes:
        for context in sorted({k[2] for k in tab if k[0] == shape}):
            step = pool_steps(tab, shape, draft, context)
            for kind in (StepFit, HingeFit):
                fits = {p: fed(kind, step, p, SPREAD) for p in POOLS}
                cols = [worst(fits, step, w, SPREAD) for w in whats]
                print(f"| {shape} | {context} | {kind.__name__} | " + " | ".join(cols) + " |")
            fits = {p: fed(StepFit, step, p, SMALL) for p in POOLS}
            cols = []
            for w in whats:
                got = [over(fits, step, w, b) for b in ASKED]
                cols.append(" / ".join("-" if g is None else f"{g:.2f}" for g in got))
            second.append(f"| {shape} | {context} | " + " | ".join(cols) + " |")
    asked = "/".join(map(str, ASKED))
    print(f"\nSeen at B = {SMALL[0]}..{SMALL[-1]}, asked at B = {asked}: prediction / measured\n")
    print("| target | context | " + " | ".join(whats) + " |")
    print("| --- " * (2 + len(whats)) + "|")
    print("\n".join(second))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
