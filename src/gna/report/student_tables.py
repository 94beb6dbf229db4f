"""The students' accuracy tables: one row per student, KV retrieval per dictionary size and over
all, the MMLU and facts formats with their 95% intervals, the context-swap agreement and
held-out perplexity; shared by every part of the students' report."""

from __future__ import annotations

import html

import polars as pl

from gna.core.chance import SKIPPED
from gna.report.htmlkit import accuracy_columns, accuracy_pivot, pct

TASK_COLUMNS = {
    "mmlu_letter": "MMLU letter (retrieval-heavy)",
    "mmlu_cloze": "MMLU cloze (knowledge)",
    "facts_cloze": "facts cloze (knowledge)",
    "facts_choice": "facts choice (knowledge + options)",
}
PERPLEXITY = "held-out perplexity"
AGREEMENT = "KV answer kept when contexts are swapped"


def accuracy_rows(scores: pl.DataFrame) -> pl.DataFrame:
    """The acc rows a student table shows, each with its `column`: 'KV <size> keys' per
    dictionary size, 'KV all', then the MMLU formats; ordered by column. Rows recording a task a
    student was not scored on (no value) are left out: not_scored_note names them."""
    scored = (pl.col("metric") == "acc") & pl.col("value").is_not_null()
    return accuracy_columns(scores.filter(scored), "KV {} keys", TASK_COLUMNS)


def metric_table(scores: pl.DataFrame, label_col: str) -> pl.DataFrame:
    """One row per variant: KV accuracy per dictionary size and overall, MMLU (each with its 95%
    interval, or flagged degenerate; headers with n), KV's context-swap agreement, perplexity."""
    labels = scores.select(label_col).unique(maintain_order=True)
    wide = labels.join(accuracy_pivot(accuracy_rows(scores), "column", [label_col]), on=label_col, how="left")
    agreement = scores.filter(
        (pl.col("metric") == "degeneracy_agreement") & (pl.col("group") == "all") & (pl.col("task") == "kv_retrieval")
    )
    if len(agreement):
        wide = wide.join(agreement.select(label_col, pl.col("value").alias(AGREEMENT)), on=label_col, how="left")
    ppl = scores.filter(pl.col("metric") == "perplexity").select(label_col, pl.col("value").alias(PERPLEXITY))
    return wide.join(ppl, on=label_col, how="left")


def metric_formats(frame: pl.DataFrame) -> dict:
    return {AGREEMENT: pct, PERPLEXITY: lambda v: f"{v:.1f}"}


def kv_at(scores: pl.DataFrame, size: int | None) -> pl.DataFrame:
    """KV acc rows at dictionary size `size` (None: all sizes) that were scored (a row recording
    why a student was not scored has no value)."""
    group = "all" if size is None else str(size)
    kv = (pl.col("task") == "kv_retrieval") & (pl.col("group") == group) & (pl.col("metric") == "acc")
    return scores.filter(kv & pl.col("value").is_not_null())


def not_scored_note(scores: pl.DataFrame) -> str:
    """The tasks the students in `scores` were not scored on, each with its recorded reason."""
    if scores.is_empty() or SKIPPED not in scores.columns:
        return ""
    rows = scores.filter(pl.col(SKIPPED).is_not_null()).unique("task", keep="first").sort("task")
    if rows.is_empty():
        return ""
    listed = "".join(
        f"<li>{html.escape(TASK_COLUMNS.get(r['task'], r['task']))}: {html.escape(r[SKIPPED])}</li>"
        for r in rows.iter_rows(named=True)
    )
    return (
        "<p class='note'>Not scored for the students (blank above; "
        f"<code>chance.skip</code>):</p><ul class='note'>{listed}</ul>"
    )
