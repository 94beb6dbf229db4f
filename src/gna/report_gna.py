"""Report section for Gather-and-Aggregate roles: attention maps of the top heads and role scores."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from gna.htmlkit import embed, pct, save_figure, table


def plot_maps(maps: pl.DataFrame, path, task: str = "kv_retrieval") -> None:
    """Grid of maps: one row per head, one column per model (teacher first, then its students),
    so the same head is seen as attention and as an SSM head side by side."""
    from gna.htmlkit import placeholder_figure

    if "task" in maps.columns:
        maps = maps.filter(pl.col("task") == task)
    if maps.is_empty():
        placeholder_figure(path, f"no {task} maps in this run")
        return
    models = sorted(maps["model"].unique(), key=lambda m: ("-hybrid-" in m, m))
    heads = maps.select("layer", "head").unique(maintain_order=True).rows()
    size = 4.2 if len(models) > 1 else 5.2
    fig, axes = plt.subplots(len(heads), len(models), figsize=(size * len(models), size * len(heads)), squeeze=False)
    for r, (layer, head) in enumerate(heads):
        for c, model in enumerate(models):
            ax = axes[r, c]
            sub = maps.filter((pl.col("model") == model) & (pl.col("layer") == layer) & (pl.col("head") == head))
            if sub.is_empty():
                ax.axis("off")
                continue
            T = sub["query"].max() + 1
            grid = np.zeros((T, T))
            grid[sub["query"].to_numpy(), sub["key"].to_numpy()] = sub["weight"].to_numpy()
            ax.imshow(grid, cmap="magma_r", vmin=0, vmax=1)
            labels = sub.select("query", "token", "mark").unique().sort("query")
            names = [t.replace("Ċ", "\\n").replace("Ġ", "·") for t in labels["token"]]
            fontsize = 5 if T <= 60 else 3
            ax.set_xticks(range(T), names, rotation=90, fontsize=fontsize)
            ax.set_yticks(range(T), names, fontsize=fontsize)
            for i, mark in enumerate(labels["mark"]):
                color = {"summary": "tab:blue", "answer": "tab:red"}.get(mark)
                if color:
                    ax.get_xticklabels()[i].set_color(color)
                    ax.get_yticklabels()[i].set_color(color)
            ax.set_title(f"{model} L{layer}H{head}", fontsize=8)
    save_figure(fig, path)


def sharpness_table(roles: pl.DataFrame) -> str:
    """Mean sharpness of the ten top-ranked heads per model and head kind (attention vs SSM)."""
    if roles.is_empty() or "sharpness" not in roles.columns:
        return ""
    if "kind" not in roles.columns:
        roles = roles.with_columns(pl.lit("attention").alias("kind"))
    top = roles.with_columns(pl.col("kind").fill_null("attention")).filter(pl.col("rank") <= 10)
    summary = (top.group_by("model", "kind").agg(pl.len().alias("heads"), pl.col("sharpness").mean().alias("mean sharpness"),
                                                pl.col("aggregate").mean().alias("mean aggregate"),
                                                pl.col("gather_strict").mean().alias("mean gather (strict)"))
               .sort("model", "kind"))
    return ("<h3>Sharpness: attention vs SSM heads</h3><p>The ten top-ranked heads of each model (the same heads "
            "in teacher and students), averaged per kind. The study reports SSM G&A as smoother than "
            "attention's: lower sharpness for the SSM heads of a student than for the same heads as attention "
            "in the teacher says the same.</p>" + table(summary, left=("model", "kind")))


def gna_section(roles: pl.DataFrame, maps: pl.DataFrame, figures: dict, masking: pl.DataFrame | None = None) -> str:
    plot_maps(maps, figures["gna_maps"], "kv_retrieval")
    if "gna_maps_mmlu" in figures:
        plot_maps(maps, figures["gna_maps_mmlu"], "mmlu_letter")
    parts = ["<h2>Gather-and-Aggregate roles</h2>",
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
             "materialised scan matrix, |T| normalised per row.</p>"]
    for model in sorted(roles["model"].unique()):
        sub = roles.filter(pl.col("model") == model)
        counts = sub.group_by("role").len().sort("role")
        if "kind" not in sub.columns:
            sub = sub.with_columns(pl.lit("attention").alias("kind"))
        sub = sub.with_columns(pl.col("kind").fill_null("attention"))
        top = sub.filter(pl.col("rank") <= 10).sort("rank").select(
            "rank", pl.format("L{}H{}", "layer", "head").alias("head"), "kind", "role", "acc_drop", "sharpness",
            "gather",
            pl.col("gather_strict").alias("gather (without previous token)"), "aggregate",
            pl.col("aggregate_summary").alias("aggregate (summary)"), "selectivity")
        best = {r: sub.filter(pl.col("role") == r).sort("rank").head(1) for r in ("gather", "aggregate")}
        found = "; ".join(f"best-ranked {r} head L{b['layer'][0]}H{b['head'][0]} (ablation rank {b['rank'][0]})"
                          for r, b in best.items() if not b.is_empty())
        parts.append(f"<h3>{html.escape(model)}</h3><p>{html.escape(found)}. Heads per role: "
                     + ", ".join(f"{r['role']} {r['len']}" for r in counts.iter_rows(named=True)) + f" (over {sub['n'][0]} prompts).</p>")
        parts.append(table(top, left=("head", "kind", "role"), fmt={"acc_drop": pct}))
    parts.append(embed(figures["gna_maps"], "Maps of the top-ranked heads and of the best-ranked Gather and "
                       "Aggregate heads on one short KV prompt, one column per model — the teacher, then its students, "
                       "where the same head is attention (kept) or an SSM head (implicit attention |T|, normalised "
                       "per row). Rows: query tokens, columns: key tokens; blue labels: summary tokens, red: the "
                       "answer position. A Gather head's summary rows attend within their own line; an Aggregate "
                       "head's answer row lands on the correct line."))
    if "gna_maps_mmlu" in figures:
        parts.append(embed(figures["gna_maps_mmlu"], "The same heads on the shortest MMLU letter prompt: each "
                           "option line is a segment (blue: its last token), red: the answer position."))
    if masking is not None and not masking.is_empty():
        parts.append("<h3>Per-sample G&A masking (KV-retrieval)</h3>")
        parts.append("<p>The best-ranked Gather and Aggregate heads under three conditions, on fresh seeded KV "
                     "prompts: (a) unmodified; (b) both heads ablated; (c) both heads restricted, per sample, to "
                     "their G&A pattern — the Gather head's rows inside a line see only that line, the Aggregate "
                     "head's answer rows see only the lines, every other row of the two heads only itself. If (c) "
                     "stays near (a) while (b) falls, the G&A pattern alone carries the retrieval.</p>")
        if "task" not in masking.columns:
            masking = masking.with_columns(pl.lit("kv_retrieval").alias("task"))
        parts.append("<p>The knowledge task (MMLU cloze, no option lines to restrict to) is scored under (a) and (b) "
                     "only.</p>")
        if "note" not in masking.columns:
            masking = masking.with_columns(pl.lit(None, pl.String).alias("note"))
        parts.append(table(masking.select("model", "heads", "task", "condition", "n", "acc", "mean_logp", "note")
                           .sort(["model", "task", "condition"]),
                           left=("model", "heads", "task", "condition", "note"), fmt={"acc": pct}))
    parts.append(sharpness_table(roles))
    return "\n".join(parts)
