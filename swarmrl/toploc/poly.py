"""Polynomials over GF(65497), vectorised with numpy: the arithmetic of a TOPLOC proof.

Values stay below 2^16, so products fit in int64 with room to spare; every
operation reduces mod P. Interpolation is Newton's divided differences
(O(k^2), k = 128 points: each of the k-1 levels is one vector operation), then
conversion from the Newton basis to ascending monomial coefficients.
"""

from __future__ import annotations

import numpy as np

P = 65497  # prime


def _fermat_inverse(a: np.ndarray) -> np.ndarray:
    result = np.ones_like(a)
    base, e = a.copy(), P - 2
    while e:
        if e & 1:
            result = result * base % P
        base = base * base % P
        e >>= 1
    return result


_INVERSES = _fermat_inverse(np.arange(P, dtype=np.int64))  # a^(P-2); entry 0 unused


def inverse(a: np.ndarray) -> np.ndarray:
    """Elementwise multiplicative inverse mod P (a table of a^(P-2)); a must be nonzero."""
    a = np.asarray(a, dtype=np.int64) % P
    if np.any(a == 0):
        raise ZeroDivisionError("0 has no inverse mod P")
    return _INVERSES[a]


def interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients c_0..c_{k-1} (ascending) of the unique polynomial of degree
    < k through the points (x_j, y_j) over GF(P). The x_j must be distinct mod P.
    Batched: x and y of shape (..., k) give coefficients of shape (..., k), one
    polynomial per leading index, all in the same vector operations."""
    x = np.asarray(x, dtype=np.int64) % P
    y = np.asarray(y, dtype=np.int64) % P
    k = x.shape[-1]
    if (np.diff(np.sort(x, axis=-1), axis=-1) == 0).any():
        raise ValueError("interpolation points must have distinct x mod P")
    # divided differences, in place: after level j, d[..., j] is the j-th Newton coefficient
    d = y.copy()
    for j in range(1, k):
        gaps = (x[..., j:] - x[..., : k - j]) % P
        d[..., j:] = (d[..., j:] - d[..., j - 1 : -1]) * _INVERSES[gaps] % P
    # Newton -> monomial: Horner on polynomials, from the highest term down; after the
    # step for x_j the polynomial has degree k-1-j, so only its first k-j terms move
    coef = np.zeros_like(d)
    coef[..., 0] = d[..., k - 1]
    for j in range(k - 2, -1, -1):
        # coef(X) <- coef(X) * (X - x_j) + d_j   (degree grows by one)
        n = k - j
        old = coef[..., : n - 1].copy()
        coef[..., :n] *= -x[..., j : j + 1]
        coef[..., 1:n] += old
        coef[..., 0] += d[..., j]
        coef[..., :n] %= P
    return coef


def evaluate(coef: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(x) for every x (Horner, vectorised over the points). Batched like
    `interpolate`: coef (..., k) with x (..., n) evaluates each polynomial at
    its own row of points."""
    coef = np.asarray(coef, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64) % P
    acc = np.zeros(np.broadcast_shapes(coef.shape[:-1] + (1,), x.shape), dtype=np.int64)
    for i in range(coef.shape[-1] - 1, -1, -1):
        acc = (acc * x + coef[..., i : i + 1]) % P
    return acc
