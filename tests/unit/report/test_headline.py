"""The reproduction check (gna.report.headline) on the golden smoke results: a run equal to the
record reproduces it; a number outside its interval, a changed verdict or a missing result is
named, and the last line says it did not reproduce."""

import shutil

import polars as pl
import pytest
from golden import GOLDEN_DIR

from gna.report.headline import compare, headline, main

KV = "tiny-llama baseline kv_retrieval"


@pytest.fixture
def run(tmp_path):
    shutil.copytree(GOLDEN_DIR, tmp_path / "data")
    return tmp_path / "data"


def test_a_run_reproduces_its_own_record(run, tmp_path, capsys):
    record = tmp_path / "headline.json"
    assert main(["write", str(run), str(record)]) == 0
    assert main(["check", str(record), str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("reproduced: ") and f"equal      {KV}: 16.7%" in "\n".join(out)
    names = [e["name"] for e in headline(run)]
    assert KV in names and "tiny-llama top-ranked head" in names
    assert any(n.startswith("tiny-llama students: k2-n8 vs teacher") for n in names)
    # the format comparison and knowledge where the answer cannot be copied from the subject
    assert "tiny-llama a letter form answered" in names
    assert "tiny-llama facts form text, 1 shot, A. (evaluation split)" in names
    assert "tiny-llama: top 4 vs unmodified, facts_cloze (not copyable)" in names


def test_numbers_within_their_interval_pass_and_outside_it_are_named(run):
    reference = headline(run)
    path = run / "results" / "baseline.parquet"
    frame = pl.read_parquet(path)
    kv = (pl.col("task") == "kv_retrieval") & (pl.col("group") == "all") & (pl.col("metric") == "acc")
    frame.with_columns(pl.when(kv).then(0.25).otherwise(pl.col("value")).alias("value")).write_parquet(path)
    lines, ok = compare(reference, headline(run))
    assert ok and f"within     {KV}: 16.7% [5–45] n=12 → 25.0% (within its interval)" in lines
    frame.with_columns(pl.when(kv).then(0.9).otherwise(pl.col("value")).alias("value")).write_parquet(path)
    lines, ok = compare(reference, headline(run))
    assert not ok and f"DIFFERS    {KV}: 16.7% [5–45] n=12 → 90.0%" in lines
    assert lines[-1].startswith("NOT reproduced: 1 of ")


def test_a_changed_verdict_and_a_missing_result_are_named(run):
    reference = headline(run)
    path = run / "results" / "hybrid" / "tiny-llama" / "comparisons.parquet"
    frame = pl.read_parquet(path)
    row = (pl.col("condition") == "k2-n8") & (pl.col("reference") == "teacher") & (pl.col("task") == "kv_retrieval")
    frame.with_columns(
        pl.when(row).then(1e-9).otherwise(pl.col("p_holm")).alias("p_holm"),
        pl.when(row).then(-0.5).otherwise(pl.col("diff")).alias("diff"),
    ).write_parquet(path)
    (run / "results" / "heads" / "tiny-llama" / "ranking.parquet").unlink()
    lines, ok = compare(reference, headline(run))
    assert not ok
    assert "VERDICT CHANGED tiny-llama students: k2-n8 vs teacher, kv_retrieval: undecided → falls" in lines
    assert "missing    tiny-llama top-ranked head" in lines
    assert lines[-1].endswith("1 of 38 verdicts changed")


def test_no_run_or_no_record_is_an_error_naming_the_file(tmp_path, run, capsys):
    with pytest.raises(FileNotFoundError, match="baseline.parquet: no finished run there"):
        headline(tmp_path / "nothing")
    assert main(["check", str(tmp_path / "none.json"), str(run)]) == 2
    assert "none.json: no headline recorded" in capsys.readouterr().err
    (tmp_path / "h.json").write_text("[]")
    assert main(["check", str(tmp_path / "h.json"), str(tmp_path / "nothing")]) == 2
    assert "no finished run there" in capsys.readouterr().err
