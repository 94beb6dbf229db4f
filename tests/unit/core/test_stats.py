import random

import polars as pl
import pytest

from gna.core.stats import wilson_exprs, wilson_interval


def test_wilson_known_values():
    # the closed form (Wilson 1927) worked by hand
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_wilson_exprs_equal_scalar():
    frame = pl.DataFrame({"value": [0.0, 0.25, 0.5, 0.975, 1.0, None], "n": [40, 8, 200, 40, 5, 10]})
    out = frame.with_columns(*wilson_exprs())
    for row in out.iter_rows(named=True):
        if row["value"] is None:
            assert row["ci_low"] is None
            continue
        low, high = wilson_interval(row["value"] * row["n"], row["n"])
        assert row["ci_low"] == pytest.approx(low) and row["ci_high"] == pytest.approx(high)


def test_wilson_covers_about_95_percent():
    rng = random.Random(0)
    p, n, trials = 0.3, 50, 2000
    covered = 0
    for _ in range(trials):
        k = sum(rng.random() < p for _ in range(n))
        low, high = wilson_interval(k, n)
        covered += low <= p <= high
    assert 0.92 <= covered / trials <= 0.98
