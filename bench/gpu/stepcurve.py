"""The pure half of ``steptime.py``: model shapes and their memory, the grid and its order,
statistics, and the analysis of a measured step-time table. Standard library only, so the
analysis runs (and is tested) where torch is absent, and re-runs on a saved CSV.

A cell is one (shape, role, B, q, L): the forward of ``B`` sequences with ``q`` new tokens
each against ``L`` cached tokens each. ``role`` is ``target`` (q = 1 is a plain decode step,
q = k + 1 verifies k drafts) or ``draft`` (always q = 1: one draft-model step).

Why one module past 600 lines: it travels with ``steptime.py`` to a GPU machine with no
checkout, where the two files are the whole benchmark, so the analysis is not spread wider.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUERIES = (1, 2, 3, 5, 8)
# the order contexts are measured in: the most telling first, so a cut-short run keeps them
CONTEXTS = (2048, 512, 8192)
# q = 1 (plain) and q = 5 (k = 4) first within a (B, L): the stop-paying analysis needs both
QUERY_ORDER = (1, 5, 3, 8, 2)
RATIO_KS = (2, 4, 7)
BREAK_EVEN_K = 4
ACCEPTANCES = (0.5, 0.7, 0.85)
LINE_FIT_MAX_B = 16
LINE_CHECK_B = (64, 256)
BYTES_PER_ELEMENT = 2  # bf16


@dataclass(frozen=True, slots=True)
class Shape:
    """A Llama-form decoder (``transformers.LlamaConfig`` keywords are derived from it).

    Two forms the field drafts and serves with now, on the same skeleton:

    - ``experts`` > 0: a mixture-of-experts target. Each layer's MLP is ``experts`` SwiGLU
      experts of ``intermediate`` each and a router; a token runs through ``active`` of them,
      so a step reads the experts its tokens chose (``weight_bytes_read``), not all of them.
    - ``fused`` > 0: an EAGLE-3 head, the draft as a single decoder layer at the target's
      width. It reads the target's hidden states from ``fused`` of its layers (an ``fc``
      from ``fused * hidden`` to ``hidden``), and its attention projects the token's
      embedding beside that state (``2 * hidden`` wide). Its embedding is the target's (not
      counted here), its LM head has its own, smaller vocabulary (``vocab``)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    attention_bias: bool = False
    rope_theta: float = 500000.0
    like: str = ""
    experts: int = 0
    active: int = 0
    fused: int = 0

    def params(self) -> int:
        return self._params(self.experts or 1)

    def active_params(self) -> int:
        """What one token runs through: every part but the experts it did not choose."""
        return self._params(self.active or 1)

    def _params(self, experts: int) -> int:
        attn_out = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attn_in = self.hidden * (2 if self.fused else 1)
        attn = attn_in * (attn_out + 2 * kv) + attn_out * self.hidden
        if self.attention_bias:
            attn += attn_out + 2 * kv
        mlp = 3 * self.hidden * self.intermediate * experts + self.hidden * self.experts
        per_layer = attn + mlp + 2 * self.hidden
        embed = self.vocab * self.hidden
        if self.fused:  # fc, hidden_norm and the LM head; the embedding is the target's
            return self.layers * per_layer + self.fused * self.hidden**2 + 2 * self.hidden + embed
        return self.layers * per_layer + embed * (1 if self.tied else 2) + self.hidden

    def weight_bytes(self) -> int:
        return self.params() * BYTES_PER_ELEMENT

    def weight_bytes_read(self, tokens: int) -> float:
        """The weights a step of ``tokens`` tokens reads: all of a dense model's; of a
        mixture, the experts its tokens chose, each once (routing taken as uniform)."""
        if not self.experts:
            return float(self.weight_bytes())
        expert = 3 * self.hidden * self.intermediate * BYTES_PER_ELEMENT
        missed = (1.0 - self.active / self.experts) ** max(tokens, 1)
        unread = self.layers * self.experts * missed * expert
        return self.weight_bytes() - unread

    def kv_bytes_per_token(self) -> int:
        """Keys and values of one cached token, all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_ELEMENT

    def flops_per_token(self) -> float:
        """Matrix FLOPs of one token through the weights (2 per parameter it runs through;
        no attention; the embedding is a lookup)."""
        lookup = 0 if self.tied or self.fused else self.vocab * self.hidden
        return 2.0 * (self.active_params() - lookup)

    def llama_config(self) -> dict[str, object]:
        return {
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "attention_bias": self.attention_bias,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 32768,
            "hidden_act": "silu",
        }


SHAPES: Mapping[str, Shape] = {
    s.name: s
    for s in (
        Shape("8b", 4096, 32, 32, 8, 128, 14336, 128256, like="Llama-3-8B"),
        Shape("1b", 2048, 16, 32, 8, 64, 8192, 128256, tied=True, like="Llama-3.2-1B"),
        Shape(
            "32b",
            5120,
            64,
            40,
            8,
            128,
            27648,
            152064,
            attention_bias=True,
            rope_theta=1000000.0,
            like="Qwen2.5-32B dimensions in Llama form",
        ),
        Shape(
            "30b-a3b",
            2048,
            48,
            32,
            4,
            128,
            768,
            151936,
            rope_theta=1000000.0,
            experts=128,
            active=8,
            like="Qwen3-30B-A3B dimensions in Llama form (its per-head q/k norms left out)",
        ),
        Shape(
            "eagle3-8b",
            4096,
            1,
            32,
            8,
            128,
            14336,
            32000,
            fused=3,
            like="an EAGLE-3 head for Llama-3.1-8B (one layer at its width, a 32k vocabulary)",
        ),
        Shape(
            "eagle3-32b",
            5120,
            1,
            40,
            8,
            128,
            27648,
            32000,
            attention_bias=True,
            rope_theta=1000000.0,
            fused=3,
            like="an EAGLE-3 head at the 32B target's width",
        ),
        Shape(
            "eagle3-30b-a3b",
            2048,
            1,
            32,
            4,
            128,
            6144,
            32000,
            rope_theta=1000000.0,
            fused=3,
            like="an EAGLE-3 head at Qwen3-30B-A3B's width (a dense layer)",
        ),
        Shape("tiny", 64, 2, 4, 2, 16, 128, 512, like="CPU tests"),
        Shape("tiny-draft", 32, 1, 2, 1, 16, 64, 512, tied=True, like="CPU tests"),
        Shape("tiny-moe", 64, 2, 4, 2, 16, 32, 512, experts=8, active=2, like="CPU tests"),
        Shape("tiny-eagle3", 64, 1, 4, 2, 16, 128, 256, fused=3, like="CPU tests"),
    )
}
# ``--draft auto``: the draft each target was measured with; an EAGLE-3 head for the MoE
# target, whose vendors ship one rather than a small model of the same family
DRAFT_FOR: Mapping[str, str] = {
    "8b": "1b",
    "32b": "1b",
    "1b": "1b",
    "30b-a3b": "eagle3-30b-a3b",
    "tiny": "tiny-draft",
    "tiny-moe": "tiny-eagle3",
}
# ``--draft eagle3``: the EAGLE-3 head at each target's width
EAGLE_FOR: Mapping[str, str] = {
    "8b": "eagle3-8b",
    "32b": "eagle3-32b",
    "30b-a3b": "eagle3-30b-a3b",
    "tiny": "tiny-eagle3",
    "tiny-moe": "tiny-eagle3",
}


def kv_elements(shape: Shape, batch: int, context: int, q: int) -> int:
    """Cache elements one cell needs: ``batch`` sequences of ``context + q`` tokens."""
    return 2 * shape.layers * batch * shape.kv_heads * (context + q) * shape.head_dim


@dataclass(frozen=True, slots=True)
class Spec:
    """A cell to measure."""

    shape: str
    role: str
    batch: int
    q: int
    context: int


def grid(
    target: str,
    draft: str | None,
    batches: Sequence[int],
    queries: Sequence[int],
    contexts: Sequence[int],
) -> list[Spec]:
    """Every cell, most important first: all (B, q) of the first context, B ascending, the
    draft's step right after the target's cells of each (B, L); then the next context."""
    order = [q for q in QUERY_ORDER if q in queries] + [q for q in queries if q not in QUERY_ORDER]
    out = []
    for context in contexts:
        for batch in sorted(batches):
            out.extend(Spec(target, "target", batch, q, context) for q in order)
            if draft:
                out.append(Spec(draft, "draft", batch, 1, context))
    return out


@dataclass(slots=True)
class Cell:
    """A measured (or skipped) cell: milliseconds of one forward, and how it went.

    ``status``: ``ok``; ``skipped-memory`` (its KV cache does not fit, so it was not tried);
    ``oom`` (tried, ran out of device memory); ``skipped-budget`` (the time budget was near);
    ``error`` (anything else; ``note`` says what)."""

    shape: str
    role: str
    batch: int
    q: int
    context: int
    status: str
    ms_median: float = math.nan
    ms_p10: float = math.nan
    ms_p90: float = math.nan
    reps: int = 0
    mode: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


CSV_FIELDS = tuple(f.name for f in fields(Cell))


def cell_row(cell: Cell) -> dict[str, object]:
    row = asdict(cell)
    for key in ("ms_median", "ms_p10", "ms_p90"):
        value = row[key]
        row[key] = "" if isinstance(value, float) and math.isnan(value) else f"{value:.4f}"
    return row


def read_cells(path: str) -> list[Cell]:
    """Cells from a ``steptime.csv``."""
    out = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            out.append(
                Cell(
                    shape=row["shape"],
                    role=row["role"],
                    batch=int(row["batch"]),
                    q=int(row["q"]),
                    context=int(row["context"]),
                    status=row["status"],
                    ms_median=float(row["ms_median"] or "nan"),
                    ms_p10=float(row["ms_p10"] or "nan"),
                    ms_p90=float(row["ms_p90"] or "nan"),
                    reps=int(row["reps"] or 0),
                    mode=row.get("mode", ""),
                    note=row.get("note", ""),
                )
            )
    return out


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def expected_tokens_per_step(a: float, k: int) -> float:
    """Leviathan et al.: (1 - a^(k+1)) / (1 - a)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


Table = dict[tuple[str, str, int, int, int], float]


def table(cells: Iterable[Cell]) -> Table:
    """Median milliseconds of every measured cell, by (shape, role, context, batch, q)."""
    return {(c.shape, c.role, c.context, c.batch, c.q): c.ms_median for c in cells if c.ok}


def _axis(tab: Table, shape: str, role: str, index: int) -> list[int]:
    return sorted({key[index] for key in tab if key[0] == shape and key[1] == role})


def verify_ratios(tab: Table, shape: str) -> dict[int, dict[int, dict[int, float]]]:
    """context -> batch -> k -> verify step / plain step (q = k + 1 against q = 1)."""
    out: dict[int, dict[int, dict[int, float]]] = {}
    for context in _axis(tab, shape, "target", 2):
        for batch in _axis(tab, shape, "target", 3):
            plain = tab.get((shape, "target", context, batch, 1))
            if not plain:
                continue
            for k in RATIO_KS:
                verify = tab.get((shape, "target", context, batch, k + 1))
                if verify:
                    out.setdefault(context, {}).setdefault(batch, {})[k] = verify / plain
    return out


def speedups(
    tab: Table, shape: str, draft: str | None, context: int, a: float, k: int = BREAK_EVEN_K
) -> dict[str, dict[int, float]]:
    """Per batch, the decode speed-up of a k-draft step over plain decoding: Leviathan's
    expected tokens per step times plain step / speculative step. ``draft_model`` adds k
    draft steps (the draft's measured q = 1 step); ``ngram`` drafts for free."""
    out: dict[str, dict[int, float]] = {"draft_model": {}, "ngram": {}}
    tokens = expected_tokens_per_step(a, k)
    for batch in _axis(tab, shape, "target", 3):
        plain = tab.get((shape, "target", context, batch, 1))
        verify = tab.get((shape, "target", context, batch, k + 1))
        if not plain or not verify:
            continue
        out["ngram"][batch] = tokens * plain / verify
        step = tab.get((draft, "draft", context, batch, 1)) if draft else None
        if step:
            out["draft_model"][batch] = tokens * plain / (verify + k * step)
    return out


@dataclass(frozen=True, slots=True)
class BreakEven:
    """Where speculation stops paying along the measured batches: ``batch`` is the first
    measured batch with a speed-up under 1 (None: it pays at every measured batch), and
    ``crossing`` the batch where the speed-up, interpolated in log2(batch), reaches 1 (None
    without a crossing; the first measured batch when it never pays)."""

    batch: int | None
    crossing: float | None
    first: float
    last: float
    batches: tuple[int, ...]

    def describe(self) -> str:
        if not self.batches:
            return "no data"
        lo, hi = self.batches[0], self.batches[-1]
        if self.batch is None:
            return f"pays up to B={hi} ({self.last:.2f}x)"
        if self.batch == lo:
            return f"never pays ({self.first:.2f}x at B={lo})"
        assert self.crossing is not None
        return f"stops at B~{self.crossing:.0f} (<1 from B={self.batch})"


def break_even(speedup: Mapping[int, float]) -> BreakEven:
    batches = tuple(sorted(speedup))
    if not batches:
        return BreakEven(None, None, math.nan, math.nan, ())
    first, last = speedup[batches[0]], speedup[batches[-1]]
    prev: int | None = None
    for batch in batches:
        s = speedup[batch]
        if s < 1.0:
            if prev is None:
                return BreakEven(batch, float(batch), first, last, batches)
            s0 = speedup[prev]
            x0, x1 = math.log2(prev), math.log2(batch)
            x = x0 + (s0 - 1.0) / (s0 - s) * (x1 - x0)
            return BreakEven(batch, 2.0**x, first, last, batches)
        prev = batch
    return BreakEven(None, None, first, last, batches)


@dataclass(frozen=True, slots=True)
class LineMiss:
    """A line ``a + b * B`` fitted over B <= 16 (weights 1 / ms^2: relative errors), and
    measured over predicted where larger batches were measured."""

    a_ms: float
    b_ms: float
    misses: dict[int, tuple[float, float]]  # batch -> (measured ms, predicted ms)


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Weighted least squares of y = a + b x, weights 1 / y^2; None under two x values."""
    if len({x for x, _ in points}) < 2:
        return None
    s = sx = sxx = sy = sxy = 0.0
    for x, y in points:
        w = 1.0 / (y * y)
        s, sx, sxx, sy, sxy = s + w, sx + w * x, sxx + w * x * x, sy + w * y, sxy + w * x * y
    det = s * sxx - sx * sx
    b = (s * sxy - sx * sy) / det
    return (sy - b * sx) / s, b


def line_misses(tab: Table, shape: str, role: str) -> dict[int, dict[int, LineMiss]]:
    """context -> q -> the line over small batches and how it misses at B = 64, 256."""
    out: dict[int, dict[int, LineMiss]] = {}
    for context in _axis(tab, shape, role, 2):
        for q in _axis(tab, shape, role, 4):
            row = {
                key[3]: ms
                for key, ms in tab.items()
                if key[:3] == (shape, role, context) and key[4] == q
            }
            line = fit_line([(b, ms) for b, ms in row.items() if b <= LINE_FIT_MAX_B])
            if line is None:
                continue
            a, b = line
            misses = {B: (row[B], a + b * B) for B in LINE_CHECK_B if B in row}
            out.setdefault(context, {})[q] = LineMiss(a, b, misses)
    return out


# --- the GPU-shaped cost model: its form is backends/sim/model.py's GpuCostModel ---------


@dataclass(frozen=True, slots=True)
class Hinge:
    """One forward's milliseconds, for ``tokens`` new tokens over ``seqs`` sequences that
    hold ``context_tokens`` cached tokens between them::

        floor + low_per_token * min(tokens, knee) + per_token * max(0, tokens - knee)
              + kv_per_token * context_tokens * max(1, kv_min_seqs / seqs)

    A memory floor (the weights read once), a slope per token while the step is
    memory-bound and a steeper one past the knee once compute dominates, and the cache
    reads. Attention that gives each (sequence, KV head) one block of the GPU runs at the
    rate of ``kv_min_seqs`` sequences until that many fill it: below, the cache costs what
    ``kv_min_seqs`` sequences of the same context would. ``seqs`` 0: the cache read at its
    full rate."""

    floor_ms: float
    per_token_ms: float
    knee_tokens: float
    kv_per_token_ms: float
    low_per_token_ms: float = 0.0
    kv_min_seqs: float = 0.0

    def ms(self, tokens: float, context_tokens: float, seqs: float = 0.0) -> float:
        if seqs > 0 and self.kv_min_seqs > seqs:
            context_tokens *= self.kv_min_seqs / seqs
        return (
            self.floor_ms
            + self.low_per_token_ms * min(tokens, self.knee_tokens)
            + self.per_token_ms * max(0.0, tokens - self.knee_tokens)
            + self.kv_per_token_ms * context_tokens
        )

    def as_seconds(self) -> dict[str, float]:
        return {
            "floor_s": self.floor_ms / 1e3,
            "low_per_token_s": self.low_per_token_ms / 1e3,
            "per_token_s": self.per_token_ms / 1e3,
            "knee_tokens": self.knee_tokens,
            "kv_per_token_s": self.kv_per_token_ms / 1e3,
            "kv_min_seqs": self.kv_min_seqs,
        }


Point = tuple[int, int, int, float]  # batch, q, context, ms


def point_ms(hinge: Hinge, point: Point) -> float:
    batch, q, context, _ = point
    return hinge.ms(batch * q, batch * context, batch)


def rel_errors(hinge: Hinge, points: Sequence[Point]) -> list[float]:
    """Model over measured, less 1, for every point."""
    return [point_ms(hinge, p) / p[3] - 1.0 for p in points]


def fit_hinge(points: Sequence[Point]) -> tuple[Hinge, float] | None:
    """The hinge that fits ``points`` best in relative least squares, and its largest
    relative error. The knee is searched over the measured token counts and
    ``kv_min_seqs`` over the measured batches, then each finely between its neighbours;
    for each pair the four coefficients are linear. None under five points."""
    if len(points) < 5:
        return None
    knees = sorted({0.0} | {float(b * q) for b, q, _, _ in points})
    floors = sorted({1.0} | {float(b) for b, _, _, _ in points})
    best = min(
        (_fit_at(points, knee, seqs) for knee in knees for seqs in floors),
        key=lambda fit: fit[0],
    )
    knee, seqs = best[1].knee_tokens, best[1].kv_min_seqs or 1.0
    fine = [knee + (_neighbour(knees, knee, s) - knee) * j / 32 for s in (-1, 1) for j in range(33)]
    best = min((_fit_at(points, k, seqs) for k in fine), key=lambda fit: fit[0])
    knee = best[1].knee_tokens
    fine = [
        seqs + (_neighbour(floors, seqs, s) - seqs) * j / 32 for s in (-1, 1) for j in range(33)
    ]
    best = min((_fit_at(points, knee, s) for s in fine), key=lambda fit: fit[0])
    hinge = best[1]
    return hinge, max(abs(e) for e in rel_errors(hinge, points))


def _neighbour(values: Sequence[float], value: float, side: int) -> float:
    i = values.index(value) if value in values else 0
    return values[min(max(i + side, 0), len(values) - 1)]


def _fit_at(points: Sequence[Point], knee: float, seqs: float) -> tuple[float, Hinge]:
    """The coefficients at a fixed knee and ``kv_min_seqs``, all >= 0 (so the slope past
    the knee is at least the one below it), weights 1 / ms^2; and the sum of squared
    relative errors."""
    rows = [
        (1.0, float(b * q), max(0.0, b * q - knee), float(c * max(b, seqs)), ms)
        for b, q, c, ms in points
    ]
    coef = _nonnegative_least_squares(rows)
    floor, low, extra, kv = coef
    hinge = Hinge(floor, low + extra, knee, kv, low, seqs if seqs > 1 else 0.0)
    return sum(e * e for e in rel_errors(hinge, points)), hinge


def _nonnegative_least_squares(rows: Sequence[tuple[float, ...]]) -> list[float]:
    """Least squares of ``rows`` (the x values, then y) in y's relative terms, with every
    coefficient >= 0: a negative one is dropped and the rest solved again."""
    n = len(rows[0]) - 1
    free = list(range(n))
    while True:
        solution = _solve_normal(rows, free)
        coef = [0.0] * n
        negative = [j for j, v in zip(free, solution, strict=True) if v < 0]
        if not negative:
            for j, v in zip(free, solution, strict=True):
                coef[j] = v
            return coef
        worst = min(negative, key=lambda j: solution[free.index(j)])
        free.remove(worst)


def _solve_normal(rows: Sequence[tuple[float, ...]], cols: Sequence[int]) -> list[float]:
    """Weighted (1 / y^2) normal equations over ``cols``, by Gaussian elimination; a column
    that adds nothing (a zero pivot) gets 0."""
    m = len(cols)
    a = [[0.0] * (m + 1) for _ in range(m)]
    for row in rows:
        y, w = row[-1], 1.0 / (row[-1] * row[-1])
        x = [row[j] for j in cols]
        for i in range(m):
            for j in range(m):
                a[i][j] += w * x[i] * x[j]
            a[i][m] += w * x[i] * y
    for i in range(m):
        pivot = max(range(i, m), key=lambda r: abs(a[r][i]))
        a[i], a[pivot] = a[pivot], a[i]
        if abs(a[i][i]) < 1e-300:
            continue
        for r in range(m):
            if r != i and a[r][i]:
                f = a[r][i] / a[i][i]
                a[r] = [v - f * p for v, p in zip(a[r], a[i], strict=True)]
    return [a[i][m] / a[i][i] if abs(a[i][i]) >= 1e-300 else 0.0 for i in range(m)]


def _points(cells: Iterable[Cell], role: str, shape: str) -> list[Point]:
    return [
        (c.batch, c.q, c.context, c.ms_median)
        for c in cells
        if c.ok and c.role == role and c.shape == shape
    ]


def fit_cost_model(cells: Iterable[Cell], target: str, draft: str | None) -> dict[str, object]:
    """The GPU cost model's parameters from the measured cells (``GpuCostModel.from_summary``
    reads this dict), each part with its largest and median relative error over the cells
    it fits."""
    out: dict[str, object] = {"form": FORM}
    cells = list(cells)
    for role, shape in (("target", target), ("draft", draft)):
        points = _points(cells, role, shape) if shape else []
        fitted = fit_hinge(points)
        if fitted is not None:
            hinge, worst = fitted
            errors = sorted(abs(e) for e in rel_errors(hinge, points))
            out[role] = {
                **hinge.as_seconds(),
                "shape": shape,
                "max_rel_error": worst,
                "median_rel_error": percentile(errors, 50),
                "cells": len(points),
            }
    return out


FORM = (
    "floor + low_per_token * min(tokens, knee) + per_token * max(0, tokens - knee) "
    "+ kv * context * max(1, kv_min_seqs / seqs)"
)


# --- the printed report ---------------------------------------------------------------------


def report(cells: Sequence[Cell], target: str, draft: str | None) -> list[str]:
    """The analyses as text lines, for one target shape: verify/plain ratios, where a k=4
    step stops paying and its speed-up by batch, the line over small batches, and the GPU
    cost model's fit."""
    tab = table(cells)
    lines = [f"== {target}: verify / plain step (q = k+1 against q = 1)"]
    lines.append("   L      B  " + "".join(f"   k={k}" for k in RATIO_KS))
    for context, rows in verify_ratios(tab, target).items():
        for batch, ratios in rows.items():
            cols = "".join(f"  {ratios[k]:5.2f}" if k in ratios else "      -" for k in RATIO_KS)
            lines.append(f"{context:5d} {batch:5d}  {cols}")
    lines.append(f"== {target}: where a k={BREAK_EVEN_K} step stops paying (draft: {draft})")
    for context in _axis(tab, target, "target", 2):
        for a in ACCEPTANCES:
            sp = speedups(tab, target, draft, context, a)
            dm = break_even(sp["draft_model"]).describe()
            ng = break_even(sp["ngram"]).describe()
            lines.append(f"L={context:5d} a={a:.2f}  draft model: {dm:32}  ngram: {ng}")
    lines += _speedup_lines(tab, target, draft)
    lines += _line_lines(tab, target, draft)
    lines += _fit_lines(cells, target, draft)
    return lines


def _speedup_lines(tab: Table, target: str, draft: str | None) -> list[str]:
    batches = _axis(tab, target, "target", 3)
    lines = [f"== {target}: k={BREAK_EVEN_K} decode speed-up over plain decoding, by batch"]
    lines.append("   L     a  drafts      " + "".join(f"{b:>7}" for b in batches))
    for context in _axis(tab, target, "target", 2):
        for a in ACCEPTANCES:
            sp = speedups(tab, target, draft, context, a)
            for way in ("draft_model", "ngram"):
                cols = "".join(f"{sp[way][b]:7.2f}" if b in sp[way] else "      -" for b in batches)
                lines.append(f"{context:5d}  {a:.2f}  {way:12}{cols}")
    return lines


def _line_lines(tab: Table, target: str, draft: str | None) -> list[str]:
    lines = [f"== {target}: a line in B fitted over B <= {LINE_FIT_MAX_B}, measured / predicted"]
    for role, shape in (("target", target), ("draft", draft)):
        if not shape:
            continue
        for context, by_q in line_misses(tab, shape, role).items():
            for q, miss in by_q.items():
                parts = [
                    f"B={b}: {m / p:.2f}x ({m:.1f} vs {p:.1f} ms)"
                    for b, (m, p) in miss.misses.items()
                ]
                fit = f"{miss.a_ms:.2f} + {miss.b_ms:.3f}*B ms"
                line = f"{shape:5} {role:6} L={context:5d} q={q}  {fit}"
                lines.append(line + ("  " + "; ".join(parts) if parts else "  (no B >= 64)"))
    return lines


def _fit_lines(cells: Sequence[Cell], target: str, draft: str | None) -> list[str]:
    fitted = fit_cost_model(cells, target, draft)
    lines = [f"== {target}: the GPU cost model fitted ({FORM})"]
    for role in ("target", "draft"):
        part = fitted.get(role)
        if not isinstance(part, Mapping):
            continue
        lines.append(
            f"{part['shape']:5} {role:6} floor {part['floor_s'] * 1e3:.3f} ms, "
            f"{part['low_per_token_s'] * 1e6:.2f} us/token up to {part['knee_tokens']:.0f} "
            f"tokens, {part['per_token_s'] * 1e6:.2f} us/token past them, "
            f"{part['kv_per_token_s'] * 1e9:.2f} ns/cached token at >= "
            f"{part['kv_min_seqs']:.2f} seqs; relative error over {part['cells']} cells: "
            f"max {part['max_rel_error']:.3f}, median {part['median_rel_error']:.3f}"
        )
    return lines


def analysis(cells: Sequence[Cell], target: str, draft: str | None) -> dict[str, object]:
    """The same analyses as JSON-ready data (summary.json)."""
    tab = table(cells)
    ratios = {
        str(c): {str(b): {str(k): r for k, r in row.items()} for b, row in rows.items()}
        for c, rows in verify_ratios(tab, target).items()
    }
    stops: dict[str, dict[str, dict[str, object]]] = {}
    for context in _axis(tab, target, "target", 2):
        for a in ACCEPTANCES:
            sp = speedups(tab, target, draft, context, a)
            entry = {}
            for way, values in sp.items():
                be = break_even(values)
                entry[way] = {
                    "speedup": {str(b): s for b, s in values.items()},
                    "first_batch_below_1": be.batch,
                    "crossing_batch": be.crossing,
                    "text": be.describe(),
                }
            stops.setdefault(str(context), {})[str(a)] = entry
    lines: dict[str, object] = {}
    for role, shape in (("target", target), ("draft", draft)):
        if shape:
            lines[role] = {
                str(c): {
                    str(q): {
                        "a_ms": m.a_ms,
                        "b_ms": m.b_ms,
                        "at": {
                            str(b): {"measured_ms": x, "line_ms": p}
                            for b, (x, p) in m.misses.items()
                        },
                    }
                    for q, m in by_q.items()
                }
                for c, by_q in line_misses(tab, shape, role).items()
            }
    return {
        "verify_over_plain": ratios,
        "k4_stops_paying": stops,
        "line_fit_small_batches": lines,
        "cost_model": fit_cost_model(cells, target, draft),
    }
