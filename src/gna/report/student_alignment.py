"""The students' report: per-head alignment error (align-n<N>-heads.parquet)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import polars as pl

from gna.report.htmlkit import SectionContext, pct, save_figure, table


def plot_align_heads(errors: pl.DataFrame, state_size: int, path) -> None:
    """Left: relative error of each SSM head after alignment (layer × head) at `state_size`;
    right: error against the teacher head's attention on the first token, every state size."""
    fig, (ax_map, ax_sink) = plt.subplots(1, 2, figsize=(11, 4))
    grid = errors.filter(pl.col("state_size") == state_size)
    if not grid.is_empty():
        n_layers, n_heads = grid["layer"].max() + 1, grid["head"].max() + 1
        values = [[float("nan")] * n_heads for _ in range(n_layers)]
        for row in grid.iter_rows(named=True):
            values[row["layer"]][row["head"]] = row["rel_error"]
        image = ax_map.imshow(values, aspect="auto", cmap="magma_r", vmin=0, vmax=max(1.0, grid["rel_error"].max()))
        fig.colorbar(image, ax=ax_map, label="relative error")
    ax_map.set(xlabel="head", ylabel="layer", title=f"SSM head error after alignment (N = {state_size})")
    for n in sorted(errors["state_size"].unique()) if not errors.is_empty() else []:
        sub = errors.filter(pl.col("state_size") == n)
        ax_sink.scatter(sub["teacher_first_token_attention"], sub["rel_error"], s=8, alpha=0.6, label=f"N = {n}")
    ax_sink.set(
        xlabel="teacher head's attention on the first token",
        ylabel="relative error",
        yscale="log",
        title="error vs the head's attention sink",
    )
    if not errors.is_empty():
        ax_sink.legend(fontsize=8)
    save_figure(fig, path)


def align_heads_part(errors: pl.DataFrame, ctx: SectionContext) -> str:
    """Per state size: the distribution of per-head errors after alignment and the worst heads."""
    if errors.is_empty():
        return ""
    stats = (
        errors.group_by("model", "state_size")
        .agg(
            pl.len().alias("SSM heads"),
            pl.col("rel_error").median().alias("median error"),
            pl.col("rel_error").quantile(0.9).alias("90th percentile"),
            pl.col("rel_error").max().alias("worst"),
            (pl.col("rel_error") > 0.5).mean().alias("share above 0.5"),
        )
        .sort("model", "state_size")
    )
    worst = (
        errors.sort("rel_error", descending=True)
        .group_by("model", "state_size", maintain_order=True)
        .head(5)
        .select(
            "model",
            "state_size",
            pl.format("L{}H{}", "layer", "head").alias("head"),
            "rel_error",
            "teacher_first_token_attention",
        )
        .sort("model", "state_size", "rel_error", descending=[False, False, True])
    )
    plot_align_heads(errors, ctx.config["hybrid"]["state_size"], ctx.figures["hybrid_align_heads"])
    return (
        "<h3>Per-head alignment error</h3><p>Relative error of each SSM head's contribution to the residual "
        "stream against its teacher head's, given the teacher's hidden state entering the layer (held windows), "
        "after stage 1.</p>"
        + table(stats, left=("model",), fmt={"share above 0.5": pct})
        + "<p>The five worst heads per state size:</p>"
        + table(worst, left=("model", "head"), fmt={"teacher_first_token_attention": pct})
        + ctx.figure("hybrid_align_heads")
    )
