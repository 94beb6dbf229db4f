"""The golden comparison itself: exact, naming file, column and row; missing and extra files fail."""

import shutil

import polars as pl
import pytest

from golden import GOLDEN_DIR, compare, cpu_kind, recorded_kind, snapshot

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


def test_the_cpu_kind_is_the_vendor_and_its_float_kernels():
    text = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16 sse\n"
    assert cpu_kind(text) == "AuthenticAMD avx2 avx512f avx512_bf16"
    assert cpu_kind("vendor_id : GenuineIntel\nflags : avx2 amx_bf16\n") == "GenuineIntel avx2 amx_bf16"
    assert recorded_kind() is not None  # the golden results say where they were recorded


def test_on_another_cpu_kind_the_teacher_is_compared_to_a_tolerance_and_students_by_shape(run_data):
    other = "another CPU"
    path = run_data / RANKING
    ranking = pl.read_parquet(path)
    ranking.with_columns(pl.col("mean_logp") * (1 + 1e-6)).write_parquet(path)
    compare(run_data, kind=other)  # rounding of another CPU's kernels
    with pytest.raises(AssertionError, match=RANKING):
        compare(run_data)  # not on the kind the golden results were recorded on
    ranking.with_columns(pl.col("mean_logp") * (1 + 1e-3)).write_parquet(path)
    with pytest.raises(AssertionError, match=rf"{RANKING}: column 'mean_logp'"):
        compare(run_data, kind=other)
    ranking.write_parquet(path)
    student = run_data / "results/hybrid/tiny-llama/k2-n8.parquet"
    frame = pl.read_parquet(student)
    frame.with_columns(pl.col("value") * 0.5).write_parquet(student)
    compare(run_data, kind=other)  # a trained student's numbers may move on another CPU
    with pytest.raises(AssertionError, match="k2-n8.parquet"):
        compare(run_data)
    frame.drop("value").write_parquet(student)
    with pytest.raises(AssertionError, match="k2-n8.parquet: columns"):
        compare(run_data, kind=other)
