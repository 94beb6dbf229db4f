"""Layer pruning: gradual (keep layers 0..k-1, final norm + head kept) and individual removal
(drop one layer of the minimal model, evaluate, put it back).

Fast path: every prefix of a model shares one forward pass (the state after layer k-1 does not
depend on later layers), so one pass reads out all depths; individual removal reuses the state
entering the removed layer (gna.engine.scoring.score_removals). Reference: `gna.engine.stack.pruned_layers` builds the
pruned model itself — a fresh ModuleList with renumbered layer_idx — and runs its own forward.
"""

from __future__ import annotations

import logging

import polars as pl

from gna.core.chance import SKIPPED, ChancePolicy, skipped
from gna.core.io import read_json, read_parquet, write_json, write_parquet
from gna.core.paired import comparisons, empty
from gna.core.settings import Evaluation, Files
from gna.engine.scoring import Scorer, known_or_scored, score_removals, score_table, summarize_task
from gna.models.prepare import load_model
from gna.tasks.tables import load_item_scores, load_task_tables

log = logging.getLogger("gna.phases.pruning")


def _tidy(per_item: pl.DataFrame, key: str) -> pl.DataFrame:
    """summarize_task per value of `key` (layers kept, removed layer), with that column."""
    return pl.concat(
        [
            summarize_task(per_item.filter(pl.col(key) == value)).with_columns(pl.lit(value).alias(key))
            for value in per_item[key].unique().sort()
        ]
    )


def gradual_items(
    model,
    tok,
    tables: dict[str, pl.DataFrame],
    batch_size: int = 8,
    progress: bool = True,
    chance: ChancePolicy = ChancePolicy(),
    scored: dict[str, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """Per-item scores of every prefix model (k = 1..n layers) on each task: score_table's frame
    with layers_kept and skipped_reason. `chance` (gna.core.chance): a task on which the full
    model is at chance is scored on the full model only (layers_kept = n), with the reason in
    skipped_reason (null where every depth ran): no prefix can show a loss there. `scored`:
    {task: the full model's per-item scores on a superset of the table's items (its baseline)},
    read for that decision instead of scoring the full model first; a task without them is
    scored."""
    n = model.config.num_hidden_layers
    frames = []
    for task, table in tables.items():
        reason = None
        if chance.applies(task):
            full = known_or_scored(Scorer(model, tok, batch_size=batch_size), table, (scored or {}).get(task))
            reason = chance.reason(full, table, "removing layers")
        if reason is None:
            items = score_table(
                Scorer(model, tok, batch_size=batch_size, progress=progress),
                table,
                desc=f"gradual {task}",
                depths=list(range(1, n + 1)),
            ).rename({"depth": "layers_kept"})
        else:
            items = full.with_columns(pl.lit(n).alias("layers_kept"))
            log.info("gradual pruning: %s on the full model only, %s", task, reason)
        frames.append(items.with_columns(skipped(reason)))
    return pl.concat(frames, how="diagonal_relaxed")


def summarize_gradual(items: pl.DataFrame) -> pl.DataFrame:
    """gradual_items summarised per task and depth, tidy: task, group, n, metric, value,
    layers_kept, skipped_reason, experiment."""
    frames = [
        _tidy(part.drop(SKIPPED), "layers_kept").with_columns(skipped(part[SKIPPED][0]))
        for part in items.partition_by("task", maintain_order=True)
    ]
    return pl.concat(frames, how="diagonal_relaxed").with_columns(pl.lit("gradual").alias("experiment"))


def gradual(
    model,
    tok,
    tables: dict[str, pl.DataFrame],
    batch_size: int = 8,
    progress: bool = True,
    chance: ChancePolicy = ChancePolicy(),
    scored: dict[str, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """Accuracy of every prefix model (k = 1..n layers) on each task, tidy: task, group, n,
    metric, value, layers_kept, skipped_reason (summarize_gradual of gradual_items, which
    documents the arguments)."""
    return summarize_gradual(gradual_items(model, tok, tables, batch_size, progress, chance, scored))


def prefix_scores(items_path: str | None, kept_layers: list[int]) -> dict[str, pl.DataFrame]:
    """{task: per-item scores of the prefix model `kept_layers` (the minimal model)} read from
    gradual pruning's per-item scores (`items_path`, gradual_items), for the tasks scored at that
    depth there; {} without a file or where `kept_layers` is not a prefix."""
    if items_path is None or kept_layers != list(range(len(kept_layers))):
        return {}
    items = read_parquet(items_path).filter(pl.col("layers_kept") == len(kept_layers))
    return {
        task: part.drop("layers_kept", SKIPPED, "model", strict=False)
        for (task,), part in items.partition_by("task", as_dict=True, maintain_order=True).items()
    }


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
    return {
        "n_layers": n,
        "layers_kept": k,
        "kept_layers": list(range(k)),
        "task": task,
        "metric": metric,
        "fraction": fraction,
        "full_value": full,
        "value": by_k[k],
        "threshold": bar,
    }


def individual(
    model,
    tok,
    tables: dict[str, pl.DataFrame],
    kept_layers: list[int],
    batch_size: int = 8,
    progress: bool = True,
    chance: ChancePolicy = ChancePolicy(),
    scored: dict[str, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """Remove each layer of the minimal model in turn; also score the minimal model itself
    (removed_layer = -1). Tidy: task, group, n, metric, value, removed_layer, skipped_reason.
    `chance`: a task on which the minimal model is at chance is scored on the minimal model
    only, with the reason in skipped_reason (null where every removal ran).
    `scored`: {task: the minimal model's per-item scores (prefix_scores)}, read instead of
    scoring it again where they hold the table's items."""
    frames = []
    for task, table in tables.items():
        base = known_or_scored(
            Scorer(model, tok, batch_size=batch_size), table, (scored or {}).get(task), layers=kept_layers
        )
        items = base.with_columns(pl.lit(-1).alias("removed_layer"))
        reason = chance.reason(base, table, "removing layers")
        if reason is None:
            removed = score_removals(
                Scorer(model, tok, batch_size=batch_size, progress=progress),
                table,
                kept_layers,
                kept_layers,
                desc=f"remove-one {task}",
            )
            items = pl.concat([items, removed])
        else:
            log.info("individual removal: %s on the minimal model only, %s", task, reason)
        frames.append(_tidy(items, "removed_layer").with_columns(skipped(reason)))
    return pl.concat(frames, how="diagonal_relaxed").with_columns(pl.lit("individual").alias("experiment"))


def gradual_comparisons(items: pl.DataFrame) -> pl.DataFrame:
    """Each prefix model against the full model on the same items (gna.core.paired), one Holm
    family: from gradual_items' per-item scores (labels '<k> layers')."""
    depths = sorted(items["layers_kept"].unique().to_list())
    if not depths:
        return empty()
    full = depths[-1]
    per_item = {f"{k} layers": part for (k,), part in items.partition_by("layers_kept", as_dict=True).items()}
    return comparisons(per_item, [("prefix vs all layers", f"{full} layers", f"{k} layers") for k in depths[:-1]])


def run_prune_gradual(
    model_name: str,
    inputs: Files,
    outputs: Files,
    max_items: int | None,
    evaluation: Evaluation = Evaluation(),
    chance: ChancePolicy = ChancePolicy(),
    retrieval_task: str | None = None,
) -> pl.DataFrame:
    """Phase prune_gradual: `gradual` on the task tables (each cut to `max_items`), its summary,
    its per-item scores (gradual_items) and its comparisons each written with a model column.
    `chance`: tasks on which the full model is at chance (judged on its baseline's per-item
    scores) are scored on the full model only; never `retrieval_task`, which defines the minimal
    model.
    inputs: model, tasks, optional baseline (list); outputs: summary, optional per_item, optional
    comparisons (gradual_comparisons)."""
    model_dir, task_paths, baseline_paths, out_path, items_path = (
        inputs.model,
        inputs.tasks,
        inputs.get("baseline", []),
        outputs.summary,
        outputs.get("per_item"),
    )
    model, tok = load_model(model_dir, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    items = gradual_items(
        model,
        tok,
        load_task_tables(task_paths, max_items),
        batch_size=evaluation.batch_size,
        chance=chance.sparing(retrieval_task),
        scored=load_item_scores(list(baseline_paths)),
    )
    result = summarize_gradual(items)
    if items_path is not None:
        write_parquet(items.with_columns(pl.lit(model_name).alias("model")), items_path)
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), out_path)
    if outputs.get("comparisons") is not None:
        compared = gradual_comparisons(items).with_columns(pl.lit(model_name).alias("model"))
        write_parquet(compared, outputs.comparisons)
    log.info("gradual pruning: %d rows", len(result))
    return result


def run_minimal_model(
    model_name: str, gradual_path: str, out_path: str, task: str, metric: str, fraction: float
) -> dict:
    """Phase minimal_model: the minimal_prefix of the gradual results in `gradual_path`, written
    to `out_path` as JSON (with the model name)."""
    best = {"model": model_name, **minimal_prefix(read_parquet(gradual_path), task, metric, fraction)}
    write_json(best, out_path)
    log.info(
        "minimal model of %s: %d of %d layers (%s %s %.3f vs full %.3f)",
        model_name,
        best["layers_kept"],
        best["n_layers"],
        best["task"],
        best["metric"],
        best["value"],
        best["full_value"],
    )
    return best


def run_prune_individual(
    model_name: str,
    inputs: Files,
    out_path: str,
    max_items: int | None,
    evaluation: Evaluation = Evaluation(),
    chance: ChancePolicy = ChancePolicy(),
) -> pl.DataFrame:
    """Phase prune_individual: `individual` removal on the minimal model of `minimal_path`
    (run_minimal_model's JSON), on the task tables `task_paths`; written to `out_path` with a
    model column. The minimal model's defining task (the JSON's `task`) is never skipped. The
    minimal model's own scores are read from gradual pruning's per-item scores
    (`gradual_items_path`) where they hold the items (prefix_scores).
    inputs: model, tasks, minimal, optional gradual_items."""
    model_dir, task_paths, minimal_path, gradual_items_path = (
        inputs.model,
        inputs.tasks,
        inputs.minimal,
        inputs.get("gradual_items"),
    )
    model, tok = load_model(model_dir, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    minimal = read_json(minimal_path)
    result = individual(
        model,
        tok,
        load_task_tables(task_paths, max_items),
        minimal["kept_layers"],
        batch_size=evaluation.batch_size,
        chance=chance.sparing(minimal["task"]),
        scored=prefix_scores(gradual_items_path, minimal["kept_layers"]),
    )
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), out_path)
    log.info("individual removal: %d rows", len(result))
    return result
