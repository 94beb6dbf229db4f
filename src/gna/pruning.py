"""Layer pruning: gradual (keep layers 0..k-1, final norm + head kept) and individual removal
(drop one layer of the minimal model, evaluate, put it back).

Fast path: every prefix of a model shares one forward pass (the state after layer k-1 does not
depend on later layers), so one pass reads out all depths; individual removal reuses the state
entering the removed layer (gna.scoring.score_removals). Reference: `pruned_layers` builds the
pruned model itself — a fresh ModuleList with renumbered layer_idx — and runs its own forward.
"""

from __future__ import annotations

import contextlib
import logging

import polars as pl
import torch

from gna.scoring import score_removals, score_table, summarize

log = logging.getLogger("gna.pruning")


@contextlib.contextmanager
def pruned_layers(model, keep: list[int]):
    """Temporarily make `model` consist of the decoder layers `keep` (in that order).

    Layers get renumbered `layer_idx` so KV caches stay aligned; everything is restored in
    `finally`, also on error."""
    base = model.base_model
    original = base.layers
    cfg = model.config
    saved_cfg = {k: getattr(cfg, k) for k in ("num_hidden_layers", "layer_types") if hasattr(cfg, k)}
    saved_idx = [(m, m.layer_idx) for m in base.modules() if hasattr(m, "layer_idx")]
    try:
        base.layers = torch.nn.ModuleList([original[i] for i in keep])
        for new, layer in enumerate(base.layers):
            for m in layer.modules():
                if hasattr(m, "layer_idx"):
                    m.layer_idx = new
        cfg.num_hidden_layers = len(keep)
        if saved_cfg.get("layer_types") is not None:
            cfg.layer_types = [saved_cfg["layer_types"][i] for i in keep]
        yield model
    finally:
        base.layers = original
        for k, v in saved_cfg.items():
            setattr(cfg, k, v)
        for m, idx in saved_idx:
            m.layer_idx = idx


def _tidy(per_item: pl.DataFrame, key: str, by_group: bool) -> pl.DataFrame:
    frames = []
    for value in per_item[key].unique().sort():
        part = per_item.filter(pl.col(key) == value)
        summary = summarize(part, by_group=False)
        if by_group:
            summary = pl.concat([summarize(part, by_group=True), summary])
        frames.append(summary.with_columns(pl.lit(value).alias(key)))
    return pl.concat(frames)


def gradual(model, tok, tables: dict[str, pl.DataFrame], batch_size: int = 8, progress: bool = True) -> pl.DataFrame:
    """Accuracy of every prefix model (k = 1..n layers) on each task, tidy:
    task, group, n, metric, value, layers_kept."""
    n = model.config.num_hidden_layers
    frames = []
    for task, table in tables.items():
        items = score_table(model, tok, table, batch_size=batch_size, progress=progress,
                            desc=f"gradual {task}", depths=list(range(1, n + 1)))
        frames.append(_tidy(items.rename({"depth": "layers_kept"}), "layers_kept", task == "kv_retrieval"))
    return pl.concat(frames).with_columns(pl.lit("gradual").alias("experiment"))


def minimal_prefix(gradual_summary: pl.DataFrame, task: str, metric: str, fraction: float) -> dict:
    """The smallest k whose `metric` on `task` is at least `fraction` of the full model's and
    stays so for every larger k (a prefix that recovers only by chance does not count)."""
    rows = gradual_summary.filter((pl.col("task") == task) & (pl.col("metric") == metric) & (pl.col("group") == "all"))
    if rows.is_empty():
        raise ValueError(f"no gradual-pruning results for task {task!r} metric {metric!r}")
    by_k = dict(zip(rows["layers_kept"].to_list(), rows["value"].to_list()))
    n = max(by_k)
    full = by_k[n]
    bar = fraction * full
    k = n
    while k - 1 >= 1 and by_k[k - 1] >= bar:
        k -= 1
    return {"n_layers": n, "layers_kept": k, "kept_layers": list(range(k)), "task": task, "metric": metric,
            "fraction": fraction, "full_value": full, "value": by_k[k], "threshold": bar}


def individual(model, tok, tables: dict[str, pl.DataFrame], kept_layers: list[int], batch_size: int = 8,
               progress: bool = True) -> pl.DataFrame:
    """Remove each layer of the minimal model in turn; also score the minimal model itself
    (removed_layer = -1). Tidy: task, group, n, metric, value, removed_layer."""
    frames = []
    for task, table in tables.items():
        base = score_table(model, tok, table, batch_size=batch_size, progress=False, layers=kept_layers)
        removed = score_removals(model, tok, table, kept_layers, kept_layers, batch_size=batch_size,
                                 progress=progress, desc=f"remove-one {task}")
        items = pl.concat([base.with_columns(pl.lit(-1).alias("removed_layer")), removed])
        frames.append(_tidy(items, "removed_layer", task == "kv_retrieval"))
    return pl.concat(frames).with_columns(pl.lit("individual").alias("experiment"))
