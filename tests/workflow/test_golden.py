"""The golden comparison itself: exact, naming file, column and row; missing and extra files fail."""

import shutil

import polars as pl
import pytest

from golden import GOLDEN_DIR, compare, snapshot

RANKING = "results/heads/tiny-llama/ranking.parquet"


@pytest.fixture
def run_data(tmp_path):
    """A data folder holding the golden results, as a smoke run would."""
    shutil.copytree(GOLDEN_DIR, tmp_path / "data")
    return tmp_path / "data"


def test_golden_results_are_stable_and_timing_free():
    frames = snapshot(GOLDEN_DIR)
    assert RANKING in frames and "results/baseline.parquet" in frames
    assert any(name.startswith("distill/") for name in frames)
    for name, frame in frames.items():
        assert not [c for c in frame.columns if "second" in c], name  # results carry no wall times
    compare(GOLDEN_DIR)


def test_row_order_does_not_matter_but_an_extra_column_does(run_data):
    path = run_data / "results/baseline.parquet"
    frame = pl.read_parquet(path)
    frame.reverse().write_parquet(path)
    compare(run_data)
    frame.with_columns(seconds=pl.lit(1.5)).write_parquet(path)
    with pytest.raises(AssertionError, match="results/baseline.parquet: columns"):
        compare(run_data)


def test_a_changed_value_names_file_column_and_row(run_data):
    path = run_data / RANKING
    frame = pl.read_parquet(path)
    nudge = pl.when(pl.int_range(pl.len()) == 3).then(1e-12).otherwise(0.0)
    frame.with_columns(pl.col("mean_logp") + nudge).write_parquet(path)
    with pytest.raises(AssertionError, match=rf"{RANKING}: column 'mean_logp', first at row \d+"):
        compare(run_data)


def test_missing_and_extra_files_fail(run_data):
    (run_data / RANKING).rename(run_data / "results/extra.parquet")
    with pytest.raises(AssertionError, match=rf"missing \['{RANKING}'\], extra \['results/extra.parquet'\]"):
        compare(run_data)
