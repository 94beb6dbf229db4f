"""Report part for how the students were trained: the alignment and KD curves, the validation
curve of checkpoint selection with the step each student was taken at, and what KD did (loss at
answer and other positions, gradient norms, how far the SSM parameters moved)."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl

from gna.core.paired import holm
from gna.core.stats import wilson_interval
from gna.report.htmlkit import SectionContext, acc_text, plural, save_figure, table


def plot_training(align: pl.DataFrame, kd: pl.DataFrame, validation: pl.DataFrame, path) -> None:
    """Left: alignment error per state size; middle: KD loss per student; right: each student's
    validation accuracy by KD step, its chosen step ringed (first model only)."""
    fig, (ax_a, ax_k, ax_v) = plt.subplots(1, 3, figsize=(15, 3.8))
    if not align.is_empty():
        for n in sorted(align["state_size"].unique()):
            sub = align.filter(pl.col("state_size") == n).group_by("step").agg(pl.col("loss").mean()).sort("step")
            ax_a.plot(sub["step"], sub["loss"], label=f"N = {n}")
        ax_a.set(
            xlabel="alignment step",
            ylabel="relative error (mean over layers)",
            yscale="log",
            title="stage 1: layer-local alignment",
        )
        ax_a.legend()
    if not kd.is_empty():
        for (k, n), sub in kd.sort("step").group_by(["heads_kept", "state_size"], maintain_order=True):
            ax_k.plot(sub["step"], sub["loss"], label=f"k={k}, N={n}")
        ax_k.set(xlabel="distillation step", ylabel="cross-entropy to teacher top-k", title="stage 2: distillation")
        ax_k.legend(fontsize=8)
    if not validation.is_empty():
        for (k, n), sub in validation.sort("after_steps").group_by(["heads_kept", "state_size"], maintain_order=True):
            (line,) = ax_v.plot(sub["after_steps"], sub["accuracy"], marker=".", label=f"k={k}, N={n}")
            chosen = sub.filter(pl.col("chosen"))
            ax_v.scatter(
                chosen["after_steps"], chosen["accuracy"], s=90, facecolors="none", edgecolors=line.get_color()
            )
        ax_v.set(
            xlabel="KD steps (0: aligned, no KD)",
            ylabel="KV accuracy, validation prompts",
            ylim=(-0.02, 1.02),
            title="checkpoint selection (ring: chosen)",
        )
        ax_v.legend(fontsize=7)
    else:
        ax_v.text(0.5, 0.5, "no checkpoint selection (hybrid.select: last)", ha="center", va="center")
        ax_v.set_axis_off()
    save_figure(fig, path)


def _validation_acc(row: dict, n: int) -> str:
    return acc_text(row["accuracy"], *wilson_interval(row["accuracy"] * n, n))


def _first_to_last(curve: pl.DataFrame, column: str) -> str:
    if curve.is_empty() or column not in curve.columns:
        return "–"
    ordered = curve.sort("step")[column]
    if ordered.is_nan().any():  # no position of that kind in a step's windows
        return "–"
    return f"{ordered[0]:.2f} → {ordered[-1]:.2f}"


def _p_best(points: pl.DataFrame) -> str:
    """The paired test's p of the best point against the last, Holm-corrected over the candidates
    (every point but the last; gna.core.paired.holm, as the selection corrects them), from their
    one-sided p-values; – where the last is the best or the points carry no test."""
    if "p_vs_last" not in points.columns:
        return "–"
    last = points["after_steps"].max()
    candidates = points.filter(pl.col("after_steps") != last)
    best = points.sort(["accuracy", "mean_logp"], descending=[True, True]).row(0, named=True)
    if best["after_steps"] == last or candidates["p_vs_last"].null_count():
        return "–"
    adjusted = dict(zip(candidates["after_steps"].to_list(), holm(candidates["p_vs_last"].to_list())))
    return f"{adjusted[best['after_steps']]:.2g}"


def selection_table(validation: pl.DataFrame, kd: pl.DataFrame, changes: pl.DataFrame, n: int) -> pl.DataFrame:
    """One row per model and student: validation accuracy (n prompts, 95% interval) once
    aligned (before KD), at the chosen step and after the last step; the KD loss at answer and at other
    positions on the first and last step; the largest gradient norm; the summed |Δ| of the SSM
    parameters at the last step."""
    keys = ["model", "heads_kept", "state_size"]
    rows = []
    for (model, k, size), sub in validation.sort("after_steps").group_by(keys, maintain_order=True):
        curve = kd.filter((pl.col("model") == model) & (pl.col("heads_kept") == k) & (pl.col("state_size") == size))
        moved = changes.filter(
            (pl.col("model") == model) & (pl.col("heads_kept") == k) & (pl.col("state_size") == size)
        )
        chosen = sub.filter(pl.col("chosen")).row(0, named=True)
        first, last = sub.row(0, named=True), sub.row(-1, named=True)

        rows.append(
            {
                "model": model,
                "student": f"k{k}-n{size}",
                "aligned, no KD": _validation_acc(first, n),
                "chosen": f"{_validation_acc(chosen, n)} (step {chosen['after_steps']})",
                "best vs last, Holm p": _p_best(sub),
                f"last (step {last['after_steps']})": _validation_acc(last, n),
                "KD loss, answer positions": _first_to_last(curve, "loss_answer"),
                "KD loss, other positions": _first_to_last(curve, "loss_other"),
                "largest gradient norm": (
                    f"{curve['grad_norm'].max():.2f}" if "grad_norm" in curve.columns and len(curve) else "–"
                ),
                "Σ|Δ| SSM parameters": f"{moved['abs_change_last'].sum():.1f}" if not moved.is_empty() else "–",
            }
        )
    return pl.DataFrame(rows)


def moved_parameters(changes: pl.DataFrame, student: tuple[str, int, int]) -> pl.DataFrame:
    """Which SSM parameters KD moved, for one (model, heads kept, state size): summed |Δ| per
    parameter name over layers, to the last step and to the chosen one, largest first."""
    model, k, size = student
    sub = changes.filter((pl.col("model") == model) & (pl.col("heads_kept") == k) & (pl.col("state_size") == size))
    return (
        sub.group_by("param")
        .agg(pl.col("numel").sum(), pl.col("abs_change_last").sum(), pl.col("abs_change_chosen").sum())
        .sort("abs_change_last", descending=True)
        .rename({"abs_change_last": "Σ|Δ| to the last step", "abs_change_chosen": "Σ|Δ| to the chosen step"})
    )


def training_part(ctx: SectionContext, hy: dict) -> str:
    """The training figure, the checkpoint-selection table and, for the budget curve's first
    student with kept heads, which parameters KD moved."""
    validation, kd, changes = ctx.frame("hybrid_validation"), ctx.frame("hybrid_kd"), ctx.frame("hybrid_changes")
    plot_training(ctx.frame("hybrid_align"), kd, validation, ctx.figures["hybrid_training"])
    parts = [ctx.figure("hybrid_training")]
    if validation.is_empty():
        return "".join(parts)
    n, steps = hy["validation"]["n"], hy["validation"]["every"]
    every = "every KD step" if steps == 1 else f"every {plural(steps, 'KD step')}"
    parts.append(
        "<h3>Checkpoint selection and what distillation did</h3>"
        f"<p>Each student is scored on {n} KV prompts of {hy['dict_size']} keys with their own seed (never "
        f"evaluation items; checked by distill_corpus_check) once aligned (alignment, then realignment; "
        f"before KD), {every} and after the "
        "last, its linear layers multiplying as the evaluation's do (<code>eval.compute_dtype</code>). Each "
        "earlier point is tested against the last step's student on the same prompts (exact one-sided McNemar: "
        "does it answer better?) with Holm's correction over those candidates; the last step's student is kept "
        "unless a point passes it, and then the best of those that pass (by accuracy, then the target's mean "
        "log-prob) is the student. <i>best vs last, Holm p</i>: the best point's corrected p. Losses are the "
        "unweighted "
        "cross-entropy to the teacher's top-k at the positions that predict an answer token and at the "
        "others, first and last step; the gradient norm is before clipping to 1.</p>"
        + table(selection_table(validation, kd, changes, n), left=("model", "student"))
    )
    kept = validation.filter(pl.col("heads_kept") > 0).select("model", "heads_kept", "state_size").unique()
    if not changes.is_empty() and not kept.is_empty():
        student = kept.sort("heads_kept", "state_size").row(len(kept) // 2)
        moved = moved_parameters(changes, student)
        parts.append(
            f"<p>Which SSM parameters distillation moved, {html.escape(student[0])} k{student[1]}-n{student[2]} "
            "(summed |Δ| over layers from the aligned values):</p>"
            + table(moved, left=("param",), fmt={c: (lambda v: f"{v:.2f}") for c in moved.columns[2:]})
        )
    return "".join(parts)
