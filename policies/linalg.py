"""The small dense linear algebra of the step-time fits (``policies/steptime.py``'s line,
``policies/stepcurve.py``'s curve): dot products, solves, inverses and the non-negative
optimum, on tuples and lists of floats. Pure.

The fits' parts differ by many orders of magnitude (seconds per step, per token, per cached
token), so a system is scaled by its diagonal before elimination."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

Vec = tuple[float, ...]
Mat = tuple[Vec, ...]


def dot(u: Sequence[float], v: Sequence[float]) -> float:
    total: float = sum(map(operator.mul, u, v))
    return total


def apply(m: Sequence[Sequence[float]], v: Sequence[float]) -> Vec:
    return tuple(dot(row, v) for row in m)


def diagonal(values: Sequence[float]) -> Mat:
    n = len(values)
    rows = [[0.0] * n for _ in range(n)]
    for i in range(n):
        rows[i][i] = values[i]
    return tuple(tuple(row) for row in rows)


def solve(m: list[list[float]], r: list[float]) -> list[float]:
    """``m x = r`` for a symmetric ``m``, scaled by its diagonal first, by elimination with
    partial pivoting; a singular direction solves to 0."""
    return solve_many(m, [r])[0]


def solve_many(m: list[list[float]], rs: Sequence[Sequence[float]]) -> list[list[float]]:
    """``m x = r`` for each ``r`` of ``rs`` (``solve``), ``m`` eliminated once: the pivots
    depend on ``m`` alone, so each answer is the one ``solve`` gives for it."""
    n = len(m)
    s = [1.0 / math.sqrt(m[i][i]) if m[i][i] > 0 else 1.0 for i in range(n)]
    m = [[x * si * sj for x, sj in zip(row, s, strict=True)] for row, si in zip(m, s, strict=True)]
    scaled = [[r[i] * s[i] for i in range(n)] for r in rs]
    return [[x * f for x, f in zip(out, s, strict=True)] for out in _eliminate(m, scaled)]


def _eliminate(m: list[list[float]], rs: list[list[float]]) -> list[list[float]]:
    """Gaussian elimination on ``[m | r...]``, the first largest pivot of each column; entries
    below the diagonal are never read again, so only those right of the pivot are updated."""
    n, width = len(m), len(m) + len(rs)
    rows = [[*m[i], *(r[i] for r in rs)] for i in range(n)]
    for col in range(n):
        pivot, largest = col, abs(rows[col][col])
        for i in range(col + 1, n):
            if abs(rows[i][col]) > largest:
                pivot, largest = i, abs(rows[i][col])
        rows[col], rows[pivot] = rows[pivot], rows[col]
        top = rows[col]
        if top[col] == 0.0:
            continue
        for i in range(col + 1, n):
            row = rows[i]
            f = row[col] / top[col]
            for j in range(col + 1, width):
                row[j] = row[j] - f * top[j]
    outs = []
    for k in range(n, width):
        out = [0.0] * n
        for i in reversed(range(n)):
            if rows[i][i] != 0.0:
                rest = sum(map(operator.mul, rows[i][i + 1 : n], out[i + 1 :]))
                out[i] = (rows[i][k] - rest) / rows[i][i]
        outs.append(out)
    return outs


def inverse(m: Sequence[Sequence[float]]) -> Mat:
    """The inverse of a symmetric positive (semi)definite matrix, by columns."""
    n = len(m)
    cols = solve_many(
        [list(row) for row in m], [[float(i == j) for i in range(n)] for j in range(n)]
    )
    return tuple(tuple((cols[j][i] + cols[i][j]) / 2 for j in range(n)) for i in range(n))


def precision(cov: Mat) -> Mat:
    """The inverse of a covariance; a diagonal one (a generic prior) directly."""
    n = len(cov)
    if all(cov[i][j] == 0.0 for i in range(n) for j in range(n) if i != j):
        return diagonal([1.0 / max(cov[i][i], 1e-300) for i in range(n)])
    return inverse(cov)


def non_negative(lam: Sequence[Sequence[float]], r: Sequence[float]) -> Vec:
    """argmin of ``b'Lb - 2r'b`` over b >= 0: parts that come out negative are pinned at 0
    one at a time, the most negative first, and the others solved again."""
    n = len(r)
    free = list(range(n))
    sub = solve([list(row) for row in lam], list(r))
    while True:
        beta = [0.0] * n
        for i, v in zip(free, sub, strict=True):
            beta[i] = v
        worst = min(free, key=lambda i: beta[i])
        if beta[worst] >= 0 or len(free) == 1:
            return tuple(max(v, 0.0) for v in beta)
        free.remove(worst)
        sub = solve([[lam[i][j] for j in free] for i in free], [r[i] for i in free])
