"""The G&A masking experiment against results recorded before the engine refactor.

The smoke config's tiny model has no Aggregate head, so the smoke run skips masking; this test
runs the experiment directly (teacher on KV + cloze + MMLU letter, and a student whose masked
heads are an SSM head and a kept attention head) and compares with tests/data/golden_masking.parquet
exactly. Recorded with the inputs below (the teacher's rows before the refactor; the student's
again when SSM heads gained the first-token term, and when unrestricted SSM heads beside masked
heads took the tree scan instead of the materialised matrix: student log-probs moved by < 2e-7, no
accuracy changed); refresh only for an intended change of results."""

import copy

import polars as pl
from polars.testing import assert_frame_equal

from conftest import MINI_MMLU, REPO
from gna.core.stats import wilson_interval
from gna.phases.gather_aggregate import kv_row_segments, mmlu_row_segments
from gna.students.spec import make_hybrid
from gna.phases.masking import masking_experiment
from gna.tasks.tables import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu

GOLDEN = REPO / "tests" / "data" / "golden_masking.parquet"
HEADS = {"gather": (1, 0), "aggregate": (2, 3)}


def test_masking_experiment_equals_recorded_results(tiny_llama):
    model, tok = tiny_llama
    kv = build_kv_retrieval([4], 6, 11, "lookup")
    subset, pool = select_mmlu(load_mmlu_jsonl(MINI_MMLU), 6, 7, None)
    cloze, letter = build_mmlu(subset, pool, "cloze", 0, 7), build_mmlu(subset, pool, "letter", 0, 7)
    teacher_kv = masking_experiment(model, tok, kv, kv_row_segments, HEADS, batch_size=4, knowledge=cloze)
    teacher_letter = masking_experiment(model, tok, letter, mmlu_row_segments, HEADS, batch_size=4)
    student = make_hybrid(copy.deepcopy(model), [HEADS["aggregate"]], 4)
    student_kv = masking_experiment(student, tok, kv, kv_row_segments, HEADS, batch_size=4, knowledge=cloze)
    actual = pl.concat([teacher_kv.with_columns(pl.lit("teacher").alias("model")),
                        teacher_letter.with_columns(pl.lit("teacher").alias("model")),
                        student_kv.with_columns(pl.lit("student").alias("model"))])
    # `note` (null where (b) and (c) ran) and the interval came after the recording; every other
    # column is as recorded
    assert actual["note"].null_count() == len(actual)
    for row in actual.iter_rows(named=True):
        assert (row["ci_low"], row["ci_high"]) == wilson_interval(round(row["acc"] * row["n"]), row["n"])
    assert_frame_equal(actual.drop("note", "ci_low", "ci_high"), pl.read_parquet(GOLDEN), check_exact=True)
