"""Layer pruning: gradual (keep layers 0..k-1, final norm + head kept) and individual removal
(drop one layer of the minimal model, evaluate, put it back).

Fast path: every prefix of a model shares one forward pass (the state after layer k-1 does not
depend on later layers), so one pass reads out all depths; individual removal reuses the state
entering the removed layer (gna.engine.scoring.score_removals). Reference: `gna.engine.stack.pruned_layers` builds the
pruned model itself — a fresh ModuleList with renumbered layer_idx — and runs its own forward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import polars as pl

from gna.core.chance import NO_REFERENCE, SKIPPED, ChancePolicy, Reference, skipped
from gna.core.io import read_json, read_parquet, write_json, write_parquet
from gna.core.paired import comparisons, empty
from gna.core.settings import Evaluation, Files, RuleSettings
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


def gradual_items(scorer: Scorer, tables: dict[str, pl.DataFrame], reference: Reference = NO_REFERENCE) -> pl.DataFrame:
    """Per-item scores of every prefix model (k = 1..n layers) on each task: score_table's frame
    with layers_kept and skipped_reason. `reference` is the full model: by its chance policy
    (gna.core.chance), a task on which the full model is at chance is scored on the full model
    only (layers_kept = n), with the reason in skipped_reason (null where every depth ran): no
    prefix can show a loss there. Its `scored` {task: the full model's per-item scores on a
    superset of the table's items (its baseline)} are read for that decision instead of scoring
    the full model first; a task without them is scored."""
    n = scorer.model.config.num_hidden_layers
    chance = reference.chance
    frames = []
    for task, table in tables.items():
        reason = None
        if chance.applies(task):
            full = known_or_scored(scorer, table, reference.scores_of(task))
            reason = chance.reason(full, table, "removing layers")
        if reason is None:
            items = score_table(scorer, table, desc=f"gradual {task}", depths=list(range(1, n + 1))).rename(
                {"depth": "layers_kept"}
            )
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


def gradual(scorer: Scorer, tables: dict[str, pl.DataFrame], reference: Reference = NO_REFERENCE) -> pl.DataFrame:
    """Accuracy of every prefix model (k = 1..n layers) on each task, tidy: task, group, n,
    metric, value, layers_kept, skipped_reason (summarize_gradual of gradual_items, which
    documents the arguments)."""
    return summarize_gradual(gradual_items(scorer, tables, reference))


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
    scorer: Scorer, tables: dict[str, pl.DataFrame], kept_layers: list[int], reference: Reference = NO_REFERENCE
) -> pl.DataFrame:
    """Remove each layer of the minimal model in turn; also score the minimal model itself
    (removed_layer = -1). Tidy: task, group, n, metric, value, removed_layer, skipped_reason.
    `reference` is the minimal model: by its chance policy, a task on which the minimal model is
    at chance is scored on the minimal model only, with the reason in skipped_reason (null where
    every removal ran); its `scored` {task: the minimal model's per-item scores (prefix_scores)}
    are read instead of scoring it again where they hold the table's items."""
    frames = []
    for task, table in tables.items():
        base = known_or_scored(scorer, table, reference.scores_of(task), layers=kept_layers)
        items = base.with_columns(pl.lit(-1).alias("removed_layer"))
        reason = reference.chance.reason(base, table, "removing layers")
        if reason is None:
            removed = score_removals(scorer, table, kept_layers, kept_layers, desc=f"remove-one {task}")
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


@dataclass(frozen=True)
class PruneGradual(RuleSettings):
    """Settings of rule prune_gradual: the `model` (wildcard), the items per task (`max_items`:
    prune.max_items; None: all), the `chance` policy (config block chance), the
    `retrieval_task` the chance policy never skips (prune.retrieval_task: it defines the minimal
    model) and how the model is loaded and scored (`evaluation`)."""

    model: str
    max_items: int | None = None
    chance: ChancePolicy = ChancePolicy()
    retrieval_task: str | None = None
    evaluation: Evaluation = Evaluation()


def run_prune_gradual(inputs: Files, outputs: Files, settings: PruneGradual) -> pl.DataFrame:
    """Phase prune_gradual: `gradual` on the task tables (each cut to `max_items`), its summary,
    its per-item scores (gradual_items) and its comparisons each written with a model column.
    `chance`: tasks on which the full model is at chance (judged on its baseline's per-item
    scores) are scored on the full model only; never `retrieval_task`, which defines the minimal
    model.
    inputs: model, tasks, optional baseline (list); outputs: summary, optional per_item, optional
    comparisons (gradual_comparisons)."""
    evaluation, model_name = settings.evaluation, settings.model
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    items = gradual_items(
        Scorer(model, tok, evaluation.batch_size),
        load_task_tables(inputs.tasks, settings.max_items),
        Reference(
            scored=load_item_scores(list(inputs.get("baseline", []))),
            chance=settings.chance.sparing(settings.retrieval_task),
        ),
    )
    result = summarize_gradual(items)
    if outputs.get("per_item") is not None:
        write_parquet(items.with_columns(pl.lit(model_name).alias("model")), outputs.per_item)
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), outputs.summary)
    if outputs.get("comparisons") is not None:
        compared = gradual_comparisons(items).with_columns(pl.lit(model_name).alias("model"))
        write_parquet(compared, outputs.comparisons)
    log.info("gradual pruning: %d rows", len(result))
    return result


@dataclass(frozen=True)
class MinimalModel(RuleSettings):
    """Settings of rule minimal_model: the `model` (wildcard), the `task` and `metric` whose
    value defines the minimal model (prune.retrieval_task, prune.retrieval_metric) and the
    `fraction` of the full model's value it keeps (prune.minimal_fraction)."""

    model: str
    task: str = "kv_retrieval"
    metric: str = "acc"
    fraction: float = 0.9


def run_minimal_model(inputs: Files, outputs: Files, settings: MinimalModel) -> dict:
    """Phase minimal_model: the minimal_prefix of the gradual results (inputs: gradual), written
    as JSON with the model name (outputs: minimal)."""
    found = minimal_prefix(read_parquet(inputs.gradual), settings.task, settings.metric, settings.fraction)
    best = {"model": settings.model, **found}
    write_json(best, outputs.minimal)
    log.info(
        "minimal model of %s: %d of %d layers (%s %s %.3f vs full %.3f)",
        settings.model,
        best["layers_kept"],
        best["n_layers"],
        best["task"],
        best["metric"],
        best["value"],
        best["full_value"],
    )
    return best


@dataclass(frozen=True)
class PruneIndividual(RuleSettings):
    """Settings of rule prune_individual: the `model` (wildcard), the items per task
    (`max_items`: prune.max_items; None: all), the `chance` policy (config block chance) and how
    the model is loaded and scored (`evaluation`)."""

    model: str
    max_items: int | None = None
    chance: ChancePolicy = ChancePolicy()
    evaluation: Evaluation = Evaluation()


def run_prune_individual(inputs: Files, outputs: Files, settings: PruneIndividual) -> pl.DataFrame:
    """Phase prune_individual: `individual` removal on the minimal model (run_minimal_model's
    JSON) on the task tables; written with a model column. The minimal model's defining task (the
    JSON's `task`) is never skipped. The minimal model's own scores are read from gradual
    pruning's per-item scores where they hold the items (prefix_scores).
    inputs: model, tasks, minimal, optional gradual_items; outputs: individual."""
    evaluation = settings.evaluation
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    minimal = read_json(inputs.minimal)
    result = individual(
        Scorer(model, tok, evaluation.batch_size),
        load_task_tables(inputs.tasks, settings.max_items),
        minimal["kept_layers"],
        Reference(
            scored=prefix_scores(inputs.get("gradual_items"), minimal["kept_layers"]),
            chance=settings.chance.sparing(minimal["task"]),
        ),
    )
    write_parquet(result.with_columns(pl.lit(settings.model).alias("model")), outputs.individual)
    log.info("individual removal: %d rows", len(result))
    return result
