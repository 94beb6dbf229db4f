"""Uncertainty of an accuracy: the Wilson score interval of a binomial proportion.

Wilson rather than the normal approximation because our accuracies sit near 0 and 1 on a few
dozen items, where the normal interval leaves [0, 1] and undercovers.
"""

from __future__ import annotations

import math

import polars as pl

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval for `successes` out of `n` (successes may be a
    mean times n). n = 0 gives the uninformative (0, 1)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} outside 0..{n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_exprs(proportion: str = "value", n: str = "n", z: float = Z95) -> tuple[pl.Expr, pl.Expr]:
    """Polars expressions (ci_low, ci_high): wilson_interval of columns `proportion` (a mean of
    0/1 outcomes) and `n`, row by row; null where n is 0 or the proportion is null."""
    p, count = pl.col(proportion), pl.col(n).cast(pl.Float64)
    denom = 1 + z * z / count
    centre = (p + z * z / (2 * count)) / denom
    half = z * (p * (1 - p) / count + z * z / (4 * count * count)).sqrt() / denom
    valid = (count > 0) & p.is_not_null()
    low = pl.when(valid).then(pl.max_horizontal(pl.lit(0.0), centre - half)).otherwise(None)
    high = pl.when(valid).then(pl.min_horizontal(pl.lit(1.0), centre + half)).otherwise(None)
    return low.alias("ci_low"), high.alias("ci_high")
