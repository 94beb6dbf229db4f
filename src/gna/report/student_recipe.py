"""The students' report: the distillation recipe ingredient by ingredient (ablation-<ingredient>.parquet)."""

from __future__ import annotations

import html

import polars as pl

from gna.report.htmlkit import plural, table
from gna.report.student_tables import metric_formats, metric_table
from gna.students.spec import parse_variant

RECIPE = (
    "<p>The recipe: SSM heads initialised from their attention heads; stage 1 starts them from the "
    "teacher heads' attention profiles (first-token share, local skip, decay) and aligns them layer by layer on the "
    "teacher's stream, then again on each student's own stream (realignment); stage "
    "2 distills end to end on all training windows with the positions "
    "that predict an answer token (KV values, MMLU letters) weighted. Each row below removes one "
    "ingredient and retrains the same student for the budget in the title, beside the full recipe at that "
    "budget; 'aligned, no KD' is the budget curve's first point.</p>"
)


def selection_note(validation: pl.DataFrame, model: str, variant: str) -> str:
    """A note where the student `variant` of `model` is a checkpoint before KD's last step (chosen
    on the validation prompts, kd-<variant>-validation.parquet), so that a reader does not take
    the full recipe's row for a distilled student: the ablations that distil choose their
    checkpoint by the same rule (their logs name it). Empty where the student is its last step or
    no validation points exist."""
    if validation.is_empty():
        return ""
    heads_kept, state_size = parse_variant(variant)
    points = validation.filter(
        (pl.col("model") == model) & (pl.col("heads_kept") == heads_kept) & (pl.col("state_size") == state_size)
    )
    chosen = points.filter(pl.col("chosen"))["after_steps"]
    if chosen.is_empty() or chosen[0] == points["after_steps"].max():
        return ""
    last = points["after_steps"].max()
    return (
        f"<p class='note'>The full recipe's {html.escape(variant)} student is its checkpoint after "
        f"{chosen[0]} of {last} distillation steps (checkpoint selection: the validation prompts show it better "
        f"than the last, Holm-corrected over the earlier points). The ablations that distil choose their "
        f"checkpoint by the same rule on the same prompts (their logs, data/logs/hybrid_ablation, name the step).</p>"
    )


def ablation_part(
    model: str, scores: pl.DataFrame, budget: pl.DataFrame, ablation: pl.DataFrame, hy: dict, validation: pl.DataFrame
) -> str:
    """The distillation recipe's ablation table for one student: the full recipe, alignment
    only (from the budget curve) and each ablation, on the budget curve's task and perplexity;
    `validation` (the students' checkpoint selection points) notes a full recipe that is not
    its last KD step (selection_note)."""
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
    note = ""
    if steps is None:  # the ablations trained as long as the student: compare with the student
        full, at = scores.filter(keep), "all distillation steps"
        note = selection_note(validation, model, variant)
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
        f"{html.escape(at)})</h3>" + RECIPE + table(shown, left=(label,), fmt=metric_formats(shown)) + note
    )
