"""Report section for per-head ablation: ranking heatmap, top heads, remove-top-k with random
controls, heads kept on the minimal model, KV accuracy vs dictionary size, attribution check."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from gna.report.htmlkit import (
    SectionContext,
    accuracy_axis,
    accuracy_columns,
    accuracy_pivot,
    comparisons_note,
    comparisons_table,
    dict_size_axis,
    errorbar,
    pct,
    removed_units,
    save_figure,
    skipped_tasks_note,
    table,
)
from gna.report.study import CITATION, KEPT_HEADS, reference_html


def _models(frame: pl.DataFrame) -> list[str]:
    return sorted(frame["model"].unique()) if not frame.is_empty() else []


def plot_heatmap(ranking: pl.DataFrame, path) -> None:
    models = _models(ranking) or ["(none)"]
    fig, axes = plt.subplots(
        1, len(models), figsize=(max(5.0, 0.45 * ranking["head"].max() + 3) * len(models), 6), squeeze=False
    )
    for ax, model in zip(axes[0], models):
        sub = ranking.filter(pl.col("model") == model)
        if sub.is_empty():
            continue
        # where no unit's removal lowers accuracy, the ranking is its log-prob drops: draw those
        measure = "acc_drop" if sub["acc_drop"].max() > 0 else "logp_drop"
        label = {"acc_drop": "accuracy drop", "logp_drop": "log-prob drop (nats)"}[measure]
        grid = np.full((sub["layer"].max() + 1, sub["head"].max() + 1), np.nan)
        for r in sub.iter_rows(named=True):
            grid[r["layer"], r["head"]] = r[measure]
        sns.heatmap(grid, ax=ax, cmap="rocket_r", vmin=min(0.0, np.nanmin(grid)), cbar_kws={"label": label})
        unit = removed_units(sub, model)[:-1]
        ax.set_xlabel(unit)
        ax.set_ylabel("layer")
        ax.set_title(f"{model}: {label} on the sweep's task when one {unit} is zeroed", fontsize=10)
    save_figure(fig, path)


def plot_topk(topk: pl.DataFrame, path) -> None:
    kv = topk.filter((pl.col("task") == "kv_retrieval") & (pl.col("group") == "all") & (pl.col("metric") == "acc"))
    models = _models(kv) or ["(none)"]
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        units = removed_units(topk, model)
        top = kv.filter((pl.col("model") == model) & (pl.col("condition") == "top")).sort("k")
        if not top.is_empty():
            errorbar(ax, top["k"], top["value"], top["ci_low"], top["ci_high"], label="top-ranked (95% interval)")
        random_k = (
            kv.filter((pl.col("model") == model) & (pl.col("condition") == "random"))
            .group_by("k")
            .agg(pl.col("value").mean().alias("mean"), pl.col("value").std().fill_null(0).alias("sd"))
            .sort("k")
        )
        if not random_k.is_empty():
            ax.errorbar(
                random_k["k"],
                random_k["mean"],
                yerr=random_k["sd"],
                marker="s",
                capsize=3,
                ls="--",
                label=f"random {units} (mean ± sd of draws)",
            )
        accuracy_axis(
            ax, f"{model}: top-ranked vs random {units}", f"{units} removed together (k)", "KV-retrieval accuracy"
        )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    save_figure(fig, path)


def curve_unit(curves: pl.DataFrame) -> str:
    """What the curves remove, in the singular: a key/value group where their labels name one (L7G0),
    else a head."""
    groups = not curves.is_empty() and curves["condition"].str.contains(r"L\d+G\d+").any()
    return "key/value group" if groups else "head"


def plot_dictsize(curves: pl.DataFrame, path) -> None:
    data = curves.filter(pl.col("metric") == "acc")
    models = _models(data) or ["(none)"]
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        sub = data.filter(pl.col("model") == model).sort("dict_size")
        for condition in sub["condition"].unique(maintain_order=True):
            line = sub.filter(pl.col("condition") == condition)
            errorbar(ax, line["dict_size"], line["value"], line["ci_low"], line["ci_high"], label=condition)
        if not sub.is_empty():
            dict_size_axis(ax, sub["dict_size"].unique().sort().to_list())
        accuracy_axis(
            ax, f"{model}: removing the #1 or #2 {curve_unit(sub)}", "dictionary size", "KV-retrieval accuracy"
        )
    save_figure(fig, path)


def plot_attribution(attr: pl.DataFrame, path) -> None:
    models = _models(attr) or ["(none)"]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        sub = attr.filter(pl.col("model") == model)
        if not sub.is_empty():
            ax.scatter(sub["logp_drop_est"], sub["logp_drop"], s=10, alpha=0.7)
            ax.set_title(f"{model}: attribution estimate vs exact (ρ={sub['spearman_logp'][0]:.2f})")
        ax.set_xlabel("estimated log-prob drop (one forward + backward)")
        ax.set_ylabel("exact log-prob drop (ablation)")
    save_figure(fig, path)


REFERENCE_KEPT = reference_html(KEPT_HEADS, f"the study's published table ({CITATION}) for {KEPT_HEADS['what']}")


def top_heads_part(ranking: pl.DataFrame, sweep: pl.DataFrame) -> str:
    """Per model: the sweep's unablated score and the ten top-ranked heads."""
    parts = []
    for model in _models(ranking):
        base = sweep.filter((pl.col("model") == model) & (pl.col("layer") == -1)).row(0, named=True)
        sub = ranking.filter(pl.col("model") == model).sort("rank")
        units = removed_units(sub, model)
        parts.append(f"<h3>{html.escape(model)}: top {units}</h3>")
        if units != "heads":
            parts.append(
                "<p>Ranked by key/value group: the query heads that read one key/value head are ablated together "
                "(heads.sweep_unit: group), as no single head's removal loses an item on this model.</p>"
            )
        if base.get("mode") == "verified":
            measured = (
                f"verified mode: the {len(sub)} of {base['heads_total']} {units} that attribution ranked "
                f"first and that fit the budget, each ablated exactly; the others were not measured "
                f"(blank in the heatmap)"
            )
        else:
            measured = f"{len(sub)} {units}, each ablated exactly"
        task = {"kv_retrieval": "KV", "mmlu_letter": "MMLU letter development"}.get(base.get("task"), "KV")
        parts.append(
            f"<p>Sweep: {base['n']} {task} prompts, unablated accuracy {pct(base['acc'])}, "
            f"mean log-prob of the correct answer {base['mean_logp']:.3f}; {measured}.</p>"
        )
        name = pl.format("L{}G{}" if units != "heads" else "L{}H{}", "layer", "head").alias(units[:-1])
        top = sub.head(10).select("rank", name, "kind", "acc", "acc_drop", "logp_drop")
        parts.append(table(top, left=(units[:-1], "kind"), fmt={"acc": pct, "acc_drop": pct}))
    return "\n".join(parts)


def topk_table(topk: pl.DataFrame) -> pl.DataFrame:
    """Per model and k: the top-k removal per task (KV per size, then all; each cell with its 95%
    interval, headers with n) beside the random-k control (mean and sd over draws)."""
    top_rows = topk.filter((pl.col("condition") == "top") & (pl.col("metric") == "acc"))
    wide = accuracy_pivot(accuracy_columns(top_rows), "column", ["model", "k"]).sort(["model", "k"])
    ctrl = (
        topk.filter(
            (pl.col("condition") == "random")
            & (pl.col("metric") == "acc")
            & (pl.col("task") == "kv_retrieval")
            & (pl.col("group") == "all")
        )
        .group_by(["model", "k"])
        .agg(
            pl.col("value").mean().alias("random-k KV (mean)"),
            pl.col("value").std().alias("random-k KV (sd)"),
            pl.len().alias("draws"),
        )
    )
    return wide.join(ctrl, on=["model", "k"], how="left").sort(["model", "k"])


def topk_part(topk: pl.DataFrame, ctx: SectionContext) -> str:
    if topk.is_empty():
        return ""
    wide = topk_table(topk)
    compared = ctx.frame("heads_topk_comparisons")
    return (
        "<h3>Removing the top-k heads (or key/value groups) together</h3>"
        + table(wide, left=("model",), fmt={"random-k KV (mean)": pct, "random-k KV (sd)": pct})
        + skipped_tasks_note(topk, "the unablated model (k = 0)", "no heads removed")
        + ctx.figure("heads_topk")
        + (
            "<h4>What the removals change, item by item</h4>"
            "<p>Each removal against the unmodified model on the same items (the random-k controls likewise), "
            "and each top-k removal against the first random draw of the same k: does removing the ranking's top "
            "heads cost more than removing as many heads at random?</p>"
            + comparisons_table(compared, ctx.margin)
            + comparisons_note(ctx.margin)
            if not compared.is_empty()
            else ""
        )
    )


def kept_part(kept: pl.DataFrame, reference: str, compared: pl.DataFrame, margin: float) -> str:
    """Per model: the minimal model with only the best-ranked head (or none) kept in two layers,
    and each variant compared item by item with the minimal model keeping all heads."""
    if kept.is_empty():
        return ""
    parts = ["<h3>Heads kept in the critical layers (minimal model)</h3>"]
    for model in _models(kept):
        sub = kept.filter((pl.col("model") == model) & (pl.col("metric") == "acc") & (pl.col("group") == "all"))
        r0 = sub.row(0, named=True)
        wide = accuracy_pivot(sub, "task", ["variant", "kept_a", "kept_b"])
        order = {v: i for i, v in enumerate(sub["variant"].unique(maintain_order=True))}
        wide = wide.sort(pl.col("variant").replace_strict(order, return_dtype=pl.Int64)).rename(
            {"kept_a": f"heads kept L{r0['layer_a']}", "kept_b": f"heads kept L{r0['layer_b']}"}
        )
        parts.append(
            f"<p><b>{html.escape(model)}</b>: the minimal model ({r0['layers_kept']} layers); in the two "
            f"layers holding the best-ranked heads, keep only that head (or none). All other layers "
            f"keep all their heads. Accuracy with its 95% interval.</p>"
        )
        parts.append(table(wide.drop("variant"), left=tuple(c for c in wide.columns if c.startswith("heads kept"))))
    parts.append(skipped_tasks_note(kept, "the minimal model with all its heads", "no heads removed"))
    if not compared.is_empty():
        parts.append(comparisons_table(compared, margin) + comparisons_note(margin))
    parts.append(reference)
    return "\n".join(parts)


def dictsize_part(curves: pl.DataFrame, ctx: SectionContext) -> str:
    if curves.is_empty():
        return ""
    wide = accuracy_pivot(
        curves.filter(pl.col("metric") == "acc").sort(["model", "dict_size"]), "condition", ["model", "dict_size"]
    ).sort(["model", "dict_size"])
    return (
        f"<h3>KV-retrieval vs dictionary size with the #1 or #2 {curve_unit(curves)} removed</h3>"
        + table(wide, left=("model",))
        + ctx.figure("heads_dictsize")
    )


def attribution_part(attribution: pl.DataFrame, ctx: SectionContext) -> str:
    if attribution.is_empty():
        return ""
    if "order" not in attribution.columns:  # results written before the order was a setting
        attribution = attribution.with_columns(pl.lit("signed").alias("order"))
    stats = (
        attribution.group_by("model")
        .agg(
            pl.col("order").first().alias("ranked by"),
            pl.col("spearman_logp").first().alias("Spearman (all heads)"),
            pl.col("top_n").first().alias("top N verified"),
            pl.col("recall_top10_in_top_n").first().alias("recall of exact top-10 in top N"),
        )
        .sort("model")
    )
    return (
        "<h3>Attribution pre-ranking vs the exact sweep</h3>"
        "<p>One forward and one backward pass estimate every head's ablation effect linearly; heads are "
        "ranked by that estimate (<i>signed</i>), by its magnitude (<i>magnitude</i>: a head whose effect the "
        "linear estimate gets wrong in sign, as for gather heads feeding later heads, stays a candidate) or "
        "by AtP*'s GradDrop score (<i>graddrop</i>), set by <code>heads.verify_order</code>. Spearman: "
        "estimated vs exact log-prob drop over all heads; recall: share of the exact sweep's top 10 among "
        "the estimate's top N, the heads a verifying sweep would measure exactly.</p>"
        + table(stats, left=("model", "ranked by"), fmt={"recall of exact top-10 in top N": pct})
        + ctx.figure("heads_attribution")
    )


def render_heads(ctx: SectionContext) -> str:
    """Per-head ablation: top heads, heatmap, remove-top-k, heads kept, dictionary size, attribution
    (empty without a ranking)."""
    if not ctx.paths("heads_ranking"):
        return ""
    ranking = ctx.frame("heads_ranking")
    topk, kept, curves = ctx.frame("heads_topk"), ctx.frame("heads_kept"), ctx.frame("heads_dictsize")
    attribution = ctx.frame("heads_attribution")
    plot_heatmap(ranking, ctx.figures["heads_heatmap"])
    plot_topk(topk, ctx.figures["heads_topk"])
    plot_dictsize(curves, ctx.figures["heads_dictsize"])
    plot_attribution(attribution, ctx.figures["heads_attribution"])
    intro = (
        "<h2>Per-head ablation</h2>"
        "<p>Each attention query head is zeroed alone (its slice of <code>o_proj</code>'s input; grouped K/V "
        "untouched) and KV-retrieval is scored on a fixed seeded prompt set. The sweep reruns only layers L..end "
        "for the heads of layer L from a cached hidden state — exactly equal to a full forward per head (tested).</p>"
    )
    parts = (
        intro,
        top_heads_part(ranking, ctx.frame("heads_sweep")),
        ctx.figure("heads_heatmap"),
        topk_part(topk, ctx),
        kept_part(kept, REFERENCE_KEPT if ctx.show_reference else "", ctx.frame("heads_kept_comparisons"), ctx.margin),
        dictsize_part(curves, ctx),
        attribution_part(attribution, ctx),
    )
    return "\n".join(part for part in parts if part)
