"""The students' report: the layer swap (swap.parquet) and its verdict from the comparisons."""

from __future__ import annotations

import html

import polars as pl

from gna.core.paired import decide
from gna.report.htmlkit import comparison_verdict, table
from gna.report.student_tables import metric_formats, metric_table, not_scored_note


def swap_part(
    model: str, swap: pl.DataFrame, students: pl.DataFrame, teacher: pl.DataFrame, hy: dict, verdict: str
) -> str:
    """The pure SSM, the same with the critical layer as attention again, and the teacher, then
    `verdict` (swap_verdict's sentence)."""
    sw = swap.filter(pl.col("model") == model) if not swap.is_empty() else swap
    if sw.is_empty():
        return ""
    pure = students.filter((pl.col("heads_kept") == 0) & (pl.col("state_size") == hy["state_size"]))
    rows = metric_table(pl.concat([pure, sw, teacher], how="diagonal_relaxed"), "variant")
    return (
        f"<h3>{html.escape(model)}: layer swap</h3>"
        f"<p>The pure SSM with the critical layer — layer {sw['swapped_layer'][0]}, home of the "
        "top-ranked head — run as the teacher's attention again (all its heads), nothing "
        "retrained.</p>" + table(rows, left=("variant",), fmt=metric_formats(rows)) + verdict + not_scored_note(sw)
    )


def swap_verdict(row: dict | None, margin: float) -> str:
    """One sentence: what the swap does to KV-retrieval over all sizes, item by item (a
    comparisons-table row), set against the study's layer swap (MMLU 33% → 50%)."""
    if row is None:
        return ""
    verb = decide(row, margin).verb
    against = {
        "rises": "as in the study (its swap took MMLU from 33% to 50%)",
        "falls": "which <b>contradicts the study</b> (its swap took MMLU from 33% to 50%)",
        "holds": "no recovery, which <b>contradicts the study</b> (its swap took MMLU from 33% to 50%)",
        "undecided": "the study's swap took MMLU from 33% to 50%; this n cannot say whether it recovers here",
    }[verb]
    return (
        f"<p><b>KV-retrieval over all sizes</b>, the swapped model against the pure SSM item by item: "
        f"{comparison_verdict(row, margin)} — {against}.</p>"
    )
