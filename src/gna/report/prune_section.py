"""Report section for layer pruning: accuracy vs layers kept, and single-layer removal."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl
import seaborn as sns

from gna.core.chance import SKIPPED
from gna.core.paired import decide, shallowest_holding
from gna.report.htmlkit import (
    SectionContext,
    accuracy_axis,
    comparisons_note,
    comparisons_table,
    pct,
    save_figure,
    skipped_tasks_note,
    table,
)

METRIC = "acc"


def _overall(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter((pl.col("metric") == METRIC) & (pl.col("group") == "all"))


def _every_depth(gradual: pl.DataFrame) -> pl.DataFrame:
    """The gradual rows of tasks scored at every depth (not those scored on the full model only)."""
    return gradual.filter(pl.col(SKIPPED).is_null()) if SKIPPED in gradual.columns else gradual


def plot_gradual(gradual: pl.DataFrame, minimal: dict[str, dict], path) -> None:
    data = _overall(_every_depth(gradual))
    models = sorted(data["model"].unique()) or ["(none)"]
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        sub = data.filter(pl.col("model") == model).sort("layers_kept")
        if not sub.is_empty():
            sns.lineplot(data=sub.to_pandas(), x="layers_kept", y="value", hue="task", marker="o", ms=4, ax=ax)
            if model in minimal:
                k = minimal[model]["layers_kept"]
                ax.axvline(k, ls=":", color="black", lw=1)
                ax.annotate(f"minimal: {k}", (k, 0.02), xytext=(4, 0), textcoords="offset points", fontsize=8)
        ax.axhline(0.25, ls="--", color="grey", lw=0.8)
        accuracy_axis(ax, f"{model}: gradual pruning from the end", "layers kept (0..k-1, final norm + head kept)")
    save_figure(fig, path)


def plot_individual(individual: pl.DataFrame, path) -> None:
    data = _overall(individual)
    models = sorted(data["model"].unique()) or ["(none)"]
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        sub = data.filter(pl.col("model") == model)
        removed = sub.filter(pl.col("removed_layer") >= 0).sort("removed_layer")
        if not removed.is_empty():
            sns.lineplot(data=removed.to_pandas(), x="removed_layer", y="value", hue="task", marker="o", ms=4, ax=ax)
            palette = dict(zip(removed["task"].unique(maintain_order=True), sns.color_palette()))
            # the minimal model's own score, for the tasks whose removals were scored
            for row in sub.filter((pl.col("removed_layer") == -1) & pl.col("task").is_in(list(palette))).iter_rows(
                named=True
            ):
                ax.axhline(row["value"], ls=":", lw=1, color=palette[row["task"]])
        elif not sub.is_empty():
            ax.text(
                0.5,
                0.5,
                "no removal scored:\nthe minimal model is at chance on every task",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=9,
                color="grey",
            )
        accuracy_axis(ax, f"{model}: remove one layer of the minimal model", "removed layer")
    save_figure(fig, path)


def _collapse_sentence(model: str, sub: pl.DataFrame, task: str) -> str:
    rows = sub.filter(pl.col("task") == task).sort("layers_kept")
    if len(rows) < 2:
        return ""
    values = rows["value"].to_list()
    ks = rows["layers_kept"].to_list()
    drops = [(values[i + 1] - values[i], ks[i]) for i in range(len(values) - 1)]
    drop, k = max(drops)
    return (
        f"<b>{html.escape(model)}</b>, {task}: the largest single step is from {pct(values[ks.index(k) + 1])} "
        f"with {k + 1} layers to {pct(values[ks.index(k)])} with {k}."
    )


def gradual_part(gradual: pl.DataFrame, ctx: SectionContext) -> str:
    """The largest step per model and task, the figure, the tasks scored on the full model only,
    and the accuracy per number of layers kept."""
    g = _overall(_every_depth(gradual))
    sentences = [
        _collapse_sentence(model, g.filter(pl.col("model") == model), task)
        for model in sorted(g["model"].unique())
        for task in sorted(g["task"].unique())
    ]
    wide = (
        g.select("model", "task", "layers_kept", "value", "n")
        .pivot(on="task", index=["model", "layers_kept"], values="value")
        .sort(["model", "layers_kept"])
    )
    return (
        "<ul>"
        + "".join(f"<li>{s}</li>" for s in sentences if s)
        + "</ul>"
        + ctx.figure("prune_gradual")
        + skipped_tasks_note(_overall(gradual), "the full model", "no shorter prefix")
        + "<details><summary>table: accuracy per number of layers kept</summary>"
        + table(wide, left=("model",), fmt={c: pct for c in wide.columns if c not in ("model", "layers_kept")})
        + "</details>"
    )


def minimal_part(minimal: list[dict]) -> str:
    """Each model's minimal model: layers kept and the retrieval score that defines it."""
    if not minimal:
        return ""
    mm = pl.DataFrame(
        [
            {
                "model": m["model"],
                "layers kept": f"{m['layers_kept']} of {m['n_layers']}",
                "defined by": f"{m['task']} {m['metric']} ≥ {m['fraction']:.0%} of full",
                "full model": m["full_value"],
                "minimal model": m["value"],
            }
            for m in minimal
        ]
    )
    return "<h3>Minimal model</h3>" + table(
        mm, left=("model", "layers kept", "defined by"), fmt={"full model": pct, "minimal model": pct}
    )


def _critical_layers(ind: pl.DataFrame, minimal: list[dict]) -> str:
    """Per model, the three single-layer removals that hurt its defining task most."""
    crit = []
    for m in minimal:
        sub = ind.filter((pl.col("model") == m["model"]) & (pl.col("task") == m["task"]))
        base = sub.filter(pl.col("removed_layer") == -1)["value"]
        worst = sub.filter(pl.col("removed_layer") >= 0).sort("value").head(3)
        if base.is_empty() or worst.is_empty():  # no removals scored (e.g. the task at chance)
            continue
        crit.append(
            f"<li><b>{html.escape(m['model'])}</b>, {m['task']}: minimal model {pct(base[0])}; "
            + ", ".join(f"without layer {r['removed_layer']}: {pct(r['value'])}" for r in worst.iter_rows(named=True))
            + "</li>"
        )
    return "<ul>" + "".join(crit) + "</ul>" if crit else ""


def individual_part(individual: pl.DataFrame, minimal: list[dict], ctx: SectionContext) -> str:
    """Single-layer removal on the minimal model: figure, critical layers, tasks skipped at chance, table."""
    ind = _overall(individual)
    if ind.is_empty():
        return ""
    wide = (
        ind.select("model", "task", "removed_layer", "value")
        .pivot(on="task", index=["model", "removed_layer"], values="value")
        .sort(["model", "removed_layer"])
    )
    return (
        "<h3>Individual layer removal on the minimal model</h3>"
        + ctx.figure("prune_individual")
        + _critical_layers(ind, minimal)
        + skipped_tasks_note(ind, "the minimal model", "no single-layer removals")
        + "<details><summary>table: accuracy with one layer removed (−1 = none removed)</summary>"
        + table(wide, left=("model",), fmt={c: pct for c in wide.columns if c not in ("model", "removed_layer")})
        + "</details>"
    )


def gradual_comparisons_part(compared: pl.DataFrame, margin: float) -> str:
    """Per model and task, read from the prefix-vs-full comparisons: the deepest prefix that falls
    below the full model and the shallowest that holds within the margin (paired tests), then
    the whole table, folded."""
    if compared.is_empty():
        return ""
    rows = []
    for (model, task), part in compared.filter(pl.col("group") == "all").group_by(
        ["model", "task"], maintain_order=True
    ):
        decisions = {int(r["condition"].split()[0]): decide(r, margin) for r in part.iter_rows(named=True)}
        verbs = {k: d.verb for k, d in decisions.items()}
        falls = [k for k, v in verbs.items() if v == "falls"]
        rows.append(
            {
                "model": model,
                "task": task,
                "deepest prefix that falls": max(falls) if falls else None,
                "shallowest prefix shown to hold": shallowest_holding(decisions),
                "prefixes not decided": sum(v == "undecided" for v in verbs.values()),
            }
        )
    return (
        "<h3>Which prefixes differ from the full model, item by item</h3>"
        "<p>Every prefix against the full model on the same items. A prefix <i>falls</i> where the paired test "
        f"shows a loss, <i>holds</i> where its accuracy is shown to lie within ±{100 * margin:g} points of the "
        "full model's; between them the n decides nothing. The shallowest prefix shown to hold is read as a fixed "
        "sequence: prefixes tested from the deepest down, stopping at the first not shown to hold, so the "
        "answer keeps its 5% without a correction.</p>"
        + table(pl.DataFrame(rows), left=("model", "task"))
        + comparisons_table(compared, margin)
        + comparisons_note(margin)
    )


def render_prune(ctx: SectionContext) -> str:
    """Gradual pruning, the minimal model and single-layer removal (empty without pruning results)."""
    if not ctx.paths("prune_gradual"):
        return ""
    gradual, individual, minimal = (
        ctx.frame("prune_gradual"),
        ctx.frame("prune_individual"),
        ctx.records("prune_minimal"),
    )
    plot_gradual(gradual, {m["model"]: m for m in minimal}, ctx.figures["prune_gradual"])
    plot_individual(individual, ctx.figures["prune_individual"])
    intro = (
        "<h2>Layer pruning</h2>"
        "<p>Gradual pruning keeps decoder layers 0..k-1 (plus the final norm and the LM head) for every k; "
        "individual removal takes the <i>minimal model</i> — the smallest prefix whose retrieval score "
        "stays within the configured fraction of the full model's — and removes one layer at a time. "
        "The study's finding to look for: knowledge (cloze) fades smoothly while the retrieval-heavy task "
        "collapses at a specific depth, and a few single layers are critical.</p>"
    )
    return "\n".join(
        part
        for part in (
            intro,
            gradual_part(gradual, ctx),
            gradual_comparisons_part(ctx.frame("prune_gradual_comparisons"), ctx.margin),
            minimal_part(minimal),
            individual_part(individual, minimal, ctx),
        )
        if part
    )
