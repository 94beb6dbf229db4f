"""Answer-row masking on hybrid students: every attention head kept from the teacher is denied
the answer rows (gna.phases.masking.answer_rows_experiment), the SSM heads are left as they are."""

from __future__ import annotations

import logging

import polars as pl

from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Files, StudentScoring
from gna.engine.chance import SKIPPED
from gna.phases.masking import answer_rows_experiment
from gna.students.spec import load_any
from gna.students.student_evaluation import skip_where_teacher_cannot_compare
from gna.tasks.tables import load_task_tables

log = logging.getLogger("gna.students.student_masking")


def run_hybrid_answer_rows(
    model_name: str, variant: str, inputs: Files, out_path: str, scoring: StudentScoring
) -> pl.DataFrame:
    """gna.phases.masking.answer_rows_experiment on student `variant` over the task tables (each cut
    to `scoring.items`), with model and variant columns, written to `out_path`. inputs: model,
    tasks; optional teacher_summary (by `scoring.chance`, a task on which the teacher is degenerate
    or at chance, skip_where_teacher_cannot_compare, is not run: its row carries the reason,
    skipped_reason, instead of accuracies) and answers (the student's per-item answers, its
    hybrid_score, read for the unmodified condition instead of scoring those items again). The
    masked condition is not run where the unmodified student is at chance (answer_rows_experiment)."""
    evaluation = scoring.evaluation
    model, tok = load_any(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    tables, reasons = skip_where_teacher_cannot_compare(
        load_task_tables(inputs.tasks, scoring.items), inputs.get("teacher_summary"), scoring.chance
    )
    answers_path = inputs.get("answers")
    scored = None
    if answers_path is not None:
        answers = read_parquet(answers_path)
        scored = {task: answers.filter(pl.col("task") == task) for task in tables}
    frame = (
        answer_rows_experiment(model, tables, tok, evaluation.batch_size, scored, scoring.chance)
        if tables
        else pl.DataFrame()
    )
    for row in frame.iter_rows(named=True):
        log.info("%s %s: acc %.3f", row["task"], row["condition"], row["acc"])
    if reasons is not None:
        frame = pl.concat(
            [frame, reasons.select("task", pl.lit(None, pl.String).alias("condition"), SKIPPED)],
            how="diagonal_relaxed",
        )
    frame = frame.with_columns(pl.lit(model_name).alias("model"), pl.lit(variant).alias("variant"))
    write_parquet(frame, out_path)
    return frame
