"""Report section for Gather-and-Aggregate roles: attention maps of the top heads and role scores."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from gna.core.chance import SKIPPED
from gna.report.htmlkit import (
    SectionContext,
    comparisons_note,
    comparisons_table,
    pct,
    placeholder_figure,
    save_figure,
    table,
    with_acc_cell,
)
from gna.students.spec import teacher_of

MARK_COLORS = {"summary": "tab:blue", "answer": "tab:red"}


def draw_map(ax, sub: pl.DataFrame, title: str) -> None:
    """One head's map (rows: query tokens, columns: key tokens); summary tokens blue, answer red."""
    if sub.is_empty():
        ax.axis("off")
        return
    T = sub["query"].max() + 1
    grid = np.zeros((T, T))
    grid[sub["query"].to_numpy(), sub["key"].to_numpy()] = sub["weight"].to_numpy()
    ax.imshow(grid, cmap="magma_r", vmin=0, vmax=1)
    labels = sub.select("query", "token", "mark").unique().sort("query")
    names = [t.replace("Ċ", "\\n").replace("Ġ", "·") for t in labels["token"]]
    fontsize = 5 if T <= 60 else 3
    ax.set_xticks(range(T), names, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(T), names, fontsize=fontsize)
    x_labels, y_labels = ax.get_xticklabels(), ax.get_yticklabels()  # each call formats every tick: once
    for i, mark in enumerate(labels["mark"]):
        color = MARK_COLORS.get(mark)
        if color:
            x_labels[i].set_color(color)
            y_labels[i].set_color(color)
    ax.set_title(title, fontsize=8)


def plot_maps(maps: pl.DataFrame, path, task: str = "kv_retrieval") -> None:
    """Grid of maps: one row per head, one column per model (teacher first, then its students),
    so the same head is seen as attention and as an SSM head side by side."""
    maps = maps.filter(pl.col("task") == task) if not maps.is_empty() else maps
    if maps.is_empty():
        placeholder_figure(path, f"no {task} maps in this run")
        return
    models = sorted(maps["model"].unique(), key=lambda m: (teacher_of(m) != m, m))
    heads = maps.select("layer", "head").unique(maintain_order=True).rows()
    size = 4.2 if len(models) > 1 else 5.2
    fig, axes = plt.subplots(len(heads), len(models), figsize=(size * len(models), size * len(heads)), squeeze=False)
    for r, (layer, head) in enumerate(heads):
        for c, model in enumerate(models):
            sub = maps.filter((pl.col("model") == model) & (pl.col("layer") == layer) & (pl.col("head") == head))
            draw_map(axes[r, c], sub, f"{model} L{layer}H{head}")
    save_figure(fig, path)


def sharpness_table(roles: pl.DataFrame) -> str:
    """Mean sharpness of the ten top-ranked heads per model and head kind (attention vs SSM)."""
    if roles.is_empty():
        return ""
    top = roles.filter(pl.col("rank") <= 10)
    summary = (
        top.group_by("model", "kind")
        .agg(
            pl.len().alias("heads"),
            pl.col("sharpness").mean().alias("mean sharpness"),
            pl.col("aggregate").mean().alias("mean aggregate"),
            pl.col("gather_strict").mean().alias("mean gather (strict)"),
        )
        .sort("model", "kind")
    )
    return (
        "<h3>Sharpness: attention vs SSM heads</h3><p>The ten top-ranked heads of each model (the same heads "
        "in teacher and students), averaged per kind. The study reports SSM G&A as smoother than "
        "attention's: lower sharpness for the SSM heads of a student than for the same heads as attention "
        "in the teacher says the same.</p>" + table(summary, left=("model", "kind"))
    )


INTRO = (
    "<h2>Gather-and-Aggregate roles</h2>"
    "<p>Role scores from each attention head's attention maps on KV-retrieval prompts, where each "
    "<code>key:value</code> line is a segment and its newline the summary token. <i>gather</i>: mass from "
    "each summary token onto its own segment (and without the token just before it, which a plain "
    "previous-token head would score on); <i>aggregate</i>: mass from the answer position onto the "
    "segments; <i>aggregate (summary)</i>: onto the summary tokens only (the study's reading); "
    "<i>selectivity</i>: share of the aggregate mass on the correct segment. A head is an Aggregate head "
    "if aggregate ≥ the configured minimum and it prefers the correct segment (selectivity ≥ 2× chance), "
    "else a Gather head if gather without the previous token ≥ its minimum. <i>sharpness</i>: the "
    "top-1 weight of the rows that matter (summary rows and the answer row), 1 = all weight on one "
    "position. Students (<code>…-hybrid-k…-n…</code>) keep their teacher's head identities and "
    "ranking; their SSM heads (kind <i>ssm</i>) are scored on their implicit attention — the "
    "materialised scan matrix, |T| normalised per row.</p>"
)

MASKING_INTRO = (
    "<h3>Per-sample G&A masking (KV-retrieval)</h3>"
    "<p>The best-ranked Gather and Aggregate heads under three conditions, on fresh seeded KV "
    "prompts: (a) unmodified; (b) both heads ablated; (c) both heads restricted, per sample, to "
    "their G&A pattern — the Gather head's rows inside a line see only that line, the Aggregate "
    "head's answer rows see only the lines, every other row of the two heads only itself. If (c) "
    "stays near (a) while (b) falls, the G&A pattern alone carries the retrieval.</p>"
    "<p>The knowledge task (MMLU cloze, no option lines to restrict to) is scored under (a) and (b) only. "
    "Where (a) cannot be told from chance on a task (its 95% interval contains chance), no condition could "
    "show a loss there: (c) on KV retrieval and (b) on the knowledge task are left out, and (a)'s row says "
    "why (<code>chance.skip: false</code> runs them anyway).</p>"
)


def model_roles(sub: pl.DataFrame, model: str) -> str:
    """One model's best Gather and Aggregate heads, heads per role, and its ten top-ranked heads."""
    counts = sub.group_by("role").len().sort("role")
    top = (
        sub.filter(pl.col("rank") <= 10)
        .sort("rank")
        .select(
            "rank",
            pl.format("L{}H{}", "layer", "head").alias("head"),
            "kind",
            "role",
            "acc_drop",
            "sharpness",
            "gather",
            pl.col("gather_strict").alias("gather (without previous token)"),
            "aggregate",
            pl.col("aggregate_summary").alias("aggregate (summary)"),
            "selectivity",
        )
    )
    best = {r: sub.filter(pl.col("role") == r).sort("rank").head(1) for r in ("gather", "aggregate")}
    found = "; ".join(
        f"best-ranked {r} head L{b['layer'][0]}H{b['head'][0]} (ablation rank {b['rank'][0]})"
        for r, b in best.items()
        if not b.is_empty()
    )
    return (
        f"<h3>{html.escape(model)}</h3><p>{html.escape(found)}. Heads per role: "
        + ", ".join(f"{r['role']} {r['len']}" for r in counts.iter_rows(named=True))
        + f" (over {sub['n'][0]} prompts).</p>"
        + table(top, left=("head", "kind", "role"), fmt={"acc_drop": pct})
    )


def masking_part(masking: pl.DataFrame, compared: pl.DataFrame, margin: float, intro: str = MASKING_INTRO) -> str:
    """`intro`, the masking conditions' accuracies, then (b) and (c) each against (a) item by item."""
    if masking.is_empty():
        return ""
    shown = with_acc_cell(masking.rename({"acc": "value"}), "acc (95% interval)").select(
        "model", "heads", "task", "condition", "n", "acc (95% interval)", "mean_logp", pl.col(SKIPPED).alias("not run")
    )
    paired = (
        "<p>Each masked condition against the unmodified model (a) on the same items:</p>"
        + comparisons_table(compared, margin)
        + comparisons_note(margin)
        if not compared.is_empty()
        else ""
    )
    return (
        intro
        + table(shown.sort(["model", "task", "condition"]), left=("model", "heads", "task", "condition", "not run"))
        + paired
    )


def render_gna(ctx: SectionContext) -> str:
    """Role scores per model, maps on KV and MMLU prompts, the masking experiment and the
    attention-vs-SSM sharpness (empty without role results)."""
    if not ctx.paths("gna_roles"):
        return ""
    roles, maps = ctx.frame("gna_roles"), ctx.frame("gna_maps")
    plot_maps(maps, ctx.figures["gna_maps"], "kv_retrieval")
    plot_maps(maps, ctx.figures["gna_maps_mmlu"], "mmlu_letter")
    parts = [INTRO]
    parts += [model_roles(roles.filter(pl.col("model") == model), model) for model in sorted(roles["model"].unique())]
    parts += [
        ctx.figure("gna_maps"),
        ctx.figure("gna_maps_mmlu"),
        masking_part(ctx.frame("gna_masking"), ctx.frame("gna_masking_comparisons"), ctx.margin),
        sharpness_table(roles),
    ]
    return "\n".join(part for part in parts if part)
