"""The step-time fits' linear algebra (``policies/linalg.py``): one elimination for many
right-hand sides answers each exactly as a solve of its own, and inverses invert, at the
scales the curve's parts span."""

from __future__ import annotations

import random

from policies.linalg import inverse, solve, solve_many


def _spd(rng: random.Random, n: int, spread: int = 8) -> list[list[float]]:
    a = [
        [rng.gauss(0.0, 1.0) * 10.0 ** rng.randint(-spread, 3) for _ in range(n)] for _ in range(n)
    ]
    return [[sum(a[k][i] * a[k][j] for k in range(n)) for j in range(n)] for i in range(n)]


def test_many_right_hand_sides_answer_as_each_alone() -> None:
    rng = random.Random(7)
    for n in (1, 2, 6):
        for singular in (False, True):
            m = _spd(rng, n)
            if singular:
                m[0] = [0.0] * n
            rs = [[rng.gauss(0.0, 1.0) for _ in range(n)] for _ in range(3)]
            together = solve_many([row[:] for row in m], rs)
            assert together == [solve([row[:] for row in m], r) for r in rs]


def test_the_inverse_inverts_a_badly_scaled_matrix() -> None:
    scales = (1e-3, 1e-2, 1.0, 1e2, 1e5, 1e-6)
    base = _spd(random.Random(5), 6, spread=0)
    m = [
        [(base[i][j] + (6.0 if i == j else 0.0)) * scales[i] * scales[j] for j in range(6)]
        for i in range(6)
    ]
    inv = inverse(tuple(tuple(row) for row in m))
    for i in range(6):
        for j in range(6):
            product = sum(m[i][k] * inv[k][j] for k in range(6))
            assert abs(product - (1.0 if i == j else 0.0)) < 1e-6
