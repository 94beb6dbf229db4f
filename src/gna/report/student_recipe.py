"""The students' report: the distillation recipe ingredient by ingredient (ablation-<ingredient>.parquet)."""

from __future__ import annotations

import html

import polars as pl

from gna.report.htmlkit import plural, table
from gna.report.student_tables import metric_formats, metric_table

RECIPE = (
    "<p>The recipe: SSM heads initialised from their attention heads; stage 1 starts them from the "
    "teacher heads' attention profiles (first-token share, local skip, decay) and aligns them layer by layer on the "
    "teacher's stream, then again on each student's own stream (realignment); stage "
    "2 distills end to end on all training windows with the positions "
    "that predict an answer token (KV values, MMLU letters) weighted. Each row below removes one "
    "ingredient and retrains the same student for the budget in the title, beside the full recipe at that "
    "budget; 'aligned, no KD' is the budget curve's first point.</p>"
)


def ablation_part(model: str, scores: pl.DataFrame, budget: pl.DataFrame, ablation: pl.DataFrame, hy: dict) -> str:
    """The distillation recipe's ablation table for one student: the full recipe, alignment
    only (from the budget curve) and each ablation, on the budget curve's task and perplexity."""
    sub = ablation.filter(pl.col("model") == model) if not ablation.is_empty() else ablation
    if sub.is_empty():
        return ""
    variant, size = hy["ablation"]["variant"], str(hy["dict_size"])
    label = "recipe"
    # the KV items of the budget curve's dictionary size only: the ablations were scored on those
    keep = (
        (
            ((pl.col("task") == "kv_retrieval") & (pl.col("group") == size))
            | (pl.col("task") == "heldout")
            | (pl.col("metric") == "degeneracy_agreement")
        )
        & (pl.col("variant") == variant)
        & (pl.col("model") == model)
    )
    steps = hy["ablation"].get("kd_steps")
    if steps is None:  # the ablations trained as long as the student: compare with the student
        full, at = scores.filter(keep), "all distillation steps"
    else:  # the ablations trained for one budget of the curve: compare with the recipe there
        full = budget.filter(keep & (pl.col("kd_steps") == steps)) if not budget.is_empty() else budget
        at = plural(steps, "distillation step") + (f", {full['kd_tokens'][0]:,} tokens" if len(full) else "")
    rows = [full.with_columns(pl.lit("full recipe").alias(label))]
    if not budget.is_empty():
        aligned = budget.filter(keep & (pl.col("kd_steps") == 0))
        rows.append(aligned.with_columns(pl.lit("aligned, no KD (0 distillation tokens)").alias(label)))
    rows.append(sub.filter(keep).with_columns(pl.col("description").alias(label)))
    shown = metric_table(pl.concat(rows, how="diagonal_relaxed"), label)
    return (
        f"<h3>{html.escape(model)}: the distillation recipe, ingredient by ingredient ({html.escape(variant)}, "
        f"{html.escape(at)})</h3>" + RECIPE + table(shown, left=(label,), fmt=metric_formats(shown))
    )
