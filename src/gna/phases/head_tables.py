"""The study's head tables, computed from a head ranking.

* remove-top-k: ablate the k top-ranked heads together and score every task, beside random-k
  controls (same k, seeded draws of heads) that show the collapse is specific to the ranking;
* heads kept: on the minimal model, keep only the top head in each of the two critical layers
  (and variants with each removed) — the study's "Heads kept in a layer" table;
* KV accuracy vs dictionary size with the #1 head removed, the #2 head removed, and neither.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import polars as pl

from gna.core.chance import NO_REFERENCE, SKIPPED, ChancePolicy, Reference
from gna.core.io import read_json, read_parquet, write_parquet
from gna.core.paired import comparisons
from gna.core.settings import Evaluation, Files, RuleSettings, TopK
from gna.engine.ablation import ablation_units, ranking_unit, score_ablations, single_heads, unit_name
from gna.engine.anatomy import head_sites, heads_per_layer
from gna.engine.scoring import Scorer, known_items, known_or_scored, summarize_task
from gna.models.prepare import load_model
from gna.phases.pruning import prefix_scores
from gna.tasks.tables import load_item_scores, load_task_tables

log = logging.getLogger("gna.phases.head_tables")

SWEEP_TASK = "kv_retrieval"  # the task the ranking was measured on (the per-head sweep's prompts)


def score_items(
    scorer: Scorer, tables: dict[str, pl.DataFrame], ablations: dict, layers=None, desc: str = "ablations"
) -> dict[object, pl.DataFrame]:
    """{key: per-item scores of every task, concatenated in table order} with the heads of each
    entry of `ablations` {key: heads} ablated (and only `layers` run, if given), all conditions
    of a task sharing one pass (score_ablations)."""
    per_task = [
        score_ablations(scorer, table, ablations, layers=layers, desc=f"{desc}: {task}")
        for task, table in tables.items()
    ]
    return {key: pl.concat([frames[key] for frames in per_task]) for key in ablations}


def summarize_items(items: dict[object, pl.DataFrame]) -> dict[object, pl.DataFrame]:
    """{key: summarize_task of each task of the key's per-item scores, concatenated in order}."""
    return {
        key: pl.concat([summarize_task(part) for part in frame.partition_by("task", maintain_order=True)])
        for key, frame in items.items()
    }


def _score(scorer: Scorer, tables, ablations, layers=None, desc="ablations"):
    """score_items, each key's per-item scores summarized per task (summarize_task)."""
    return summarize_items(score_items(scorer, tables, ablations, layers, desc))


def top_units(ranking: pl.DataFrame, k: int) -> list[tuple[int, int]]:
    """(layer, index) of the k top-ranked units (heads, or key/value groups)."""
    top = ranking.sort("rank").head(k)
    return list(zip(top["layer"].to_list(), top["head"].to_list()))


def units_label(units: list[tuple[int, int]], unit: str) -> str:
    """'L13G0 L14G0' / 'L3H1 L4H2': the units of a condition, as the tables name them."""
    return " ".join(unit_name(layer, index, unit) for layer, index in units)


def remove_top_k(
    scorer: Scorer,
    ranking: pl.DataFrame,
    tables: dict[str, pl.DataFrame],
    top_k: TopK,
    reference: Reference = NO_REFERENCE,
    per_item: dict[str, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """Tidy: condition (top | random), k, draw, heads, task, group, n, metric, value,
    skipped_reason; the k of `top_k.ks`. The random-k controls score `top_k.control_tasks`: the
    sweep's task (SWEEP_TASK) at every k with `top_k.random_draws` draws, the others at the k of
    `top_k.control_k` only (None: every k) with the first `top_k.control_draws` of the same draws
    (None: random_draws); a task outside `top_k.curve_tasks` (None: every task) is scored, top and
    random, only at k = 0 and the k of control_k. `reference` is the unmodified model: its `scored` {task: per-item
    scores} (its baseline) are read for k = 0 instead of scoring the same items again; by its
    `chance` policy, a task on which it is at chance is scored at k = 0 only, with the reason in
    skipped_reason (null elsewhere). `per_item`, where given, receives every condition's per-item scores by its
    label (topk_label), for topk_comparisons."""
    ks, random_draws, control_tasks = top_k.ks, top_k.random_draws, top_k.control_tasks
    control_k, control_draws, curve_tasks = top_k.control_k, top_k.control_draws, top_k.curve_tasks
    short = [k for k in ks if k > len(ranking)]
    if short:
        raise ValueError(
            f"heads.top_k: removing the top {max(short)} {ranking_unit(ranking)}s needs {max(short)} ranked "
            f"{ranking_unit(ranking)}s; the ranking has {len(ranking)} (a verified sweep ranks only those that fit "
            f"heads.verify_budget: raise it, or use heads.sweep_mode: exact)"
        )
    unit = ranking_unit(ranking)
    units = ablation_units(scorer.model, unit)
    population = list(units)
    chance = reference.chance
    # (condition, k, draw, the units removed); a group's query heads are removed together
    jobs = [("top", k, 0, top_units(ranking, k)) for k in ks]
    control_draws = random_draws if control_draws is None else control_draws
    for k in ks:
        if k == 0:
            continue
        for draw in range(max(random_draws, control_draws)):
            # head draws keep their seed string: the random-k heads of every earlier run stay the same
            rng = random.Random(f"random-{'heads' if unit == 'head' else unit + 's'}-{top_k.seed}-{k}-{draw}")
            jobs.append(("random", k, draw, sorted(rng.sample(population, min(k, len(population))))))
    heads_of_job = [[h for key in chosen for h in units[key]] for *_, chosen in jobs]

    def on_curve(task: str, k: int) -> bool:
        # outside curve_tasks a task is scored where the knowledge view reads it: k = 0 and control_k
        # (TopK refuses curve_tasks without control_k)
        return k == 0 or curve_tasks is None or task in curve_tasks or k in control_k

    def used_by(condition: str, k: int, draw: int) -> list[str]:
        if condition == "top":
            return [t for t in tables if on_curve(t, k)]
        return [
            t
            for t in control_tasks
            if t in tables
            and on_curve(t, k)
            and (
                draw < random_draws
                if t == SWEEP_TASK
                else draw < control_draws and (control_k is None or k in control_k)
            )
        ]

    # per task, every condition scoring it in one pass (k = 0 read from the baseline where given)
    items, reasons = {}, {}
    for task, table in tables.items():
        wanted = {
            i: heads_of_job[i] for i, (condition, k, draw, _) in enumerate(jobs) if task in used_by(condition, k, draw)
        }
        unablated = [i for i in wanted if jobs[i][1] == 0]
        if chance.applies(task):
            base = known_or_scored(scorer, table, reference.scores_of(task))
            reasons[task] = chance.reason(base, table, "removing heads")
            if reasons[task] is not None:
                log.info("remove top-k: %s at k = 0 only, %s", task, reasons[task])
                items.update({(i, task): base for i in unablated})
                continue
        if reference.has(task):
            for i in unablated:
                items[i, task] = known_items(table, reference.scores_of(task))
                del wanted[i]
        items.update(
            {(i, task): frame for i, frame in score_items(scorer, {task: table}, wanted, desc="remove top-k").items()}
        )
    summaries = {key: summarize_task(frame) for key, frame in items.items()}
    if per_item is not None:
        for i, (condition, k, draw, _) in enumerate(jobs):
            frames = [items[i, task] for task in tables if (i, task) in items]
            if frames:
                per_item[topk_label(condition, k, draw)] = pl.concat(frames)
    return pl.concat(
        [
            pl.concat(
                [summaries[i, task] for task in used_by(condition, k, draw) if (i, task) in summaries]
            ).with_columns(
                pl.lit(condition).alias("condition"),
                pl.lit(k).alias("k"),
                pl.lit(draw).alias("draw"),
                pl.lit(units_label(chosen, unit)).alias("heads"),
                pl.lit(unit).alias("unit"),
            )
            for i, (condition, k, draw, chosen) in enumerate(jobs)
            if any((i, task) in summaries for task in used_by(condition, k, draw))
        ]
    ).with_columns(_reason_column(reasons))


UNMODIFIED = "unmodified"
ALL_HEADS = "all heads"  # the heads-kept variant every other is compared with


def topk_label(condition: str, k: int, draw: int = 0) -> str:
    """The label of a remove-top-k condition in its comparisons table: 'unmodified' (k = 0),
    'top 5', 'random 5 #0'."""
    if k == 0:
        return UNMODIFIED
    return f"top {k}" if condition == "top" else f"random {k} #{draw}"


def topk_comparisons(per_item: dict[str, pl.DataFrame], top_k: TopK) -> pl.DataFrame:
    """The remove-top-k comparisons (gna.core.paired): each top-k removal against the unmodified
    model, each random-k control against it, and each top-k removal against the first random draw
    of the same k (is the ranking's collapse more than any k heads'?), one Holm family each."""
    ks = [k for k in top_k.ks if k > 0]
    draws = sorted({int(label.rsplit("#", 1)[1]) for label in per_item if label.startswith("random ")})
    pairs = [("top k vs unmodified", UNMODIFIED, topk_label("top", k)) for k in ks]
    pairs += [("random k vs unmodified", UNMODIFIED, topk_label("random", k, d)) for k in ks for d in draws]
    pairs += [("top k vs random k", topk_label("random", k, 0), topk_label("top", k)) for k in ks]
    return comparisons(per_item, pairs)


def _reason_column(reasons: dict[str, str | None]) -> pl.Expr:
    """skipped_reason per row: the reason recorded for the row's task (null: every condition ran)."""
    return pl.col("task").replace_strict(reasons, default=None, return_dtype=pl.String).alias(SKIPPED)


def critical_heads(ranking: pl.DataFrame, kept_layers: list[int]) -> list[tuple[int, int]]:
    """The two best-ranked heads inside the kept layers, from two different layers, in layer order."""
    single_heads(ranking, "the heads-kept table")
    chosen: list[tuple[int, int]] = []
    for row in ranking.sort("rank").iter_rows(named=True):
        if row["layer"] in kept_layers and all(row["layer"] != l for l, _ in chosen):
            chosen.append((row["layer"], row["head"]))
        if len(chosen) == 2:
            break
    if len(chosen) < 2:
        raise ValueError(f"fewer than two ranked heads in distinct kept layers {kept_layers}")
    return sorted(chosen)


def heads_kept(
    scorer: Scorer,
    ranking: pl.DataFrame,
    kept_layers: list[int],
    tables: dict[str, pl.DataFrame],
    reference: Reference = NO_REFERENCE,
    per_item: dict[str, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """Minimal model; in critical layers A and B keep only head a / b, or none.
    Rows: variant label, kept_a, kept_b, task, group, n, metric, value, skipped_reason.
    `reference` is the minimal model: by its `chance` policy, a task on which it is at chance is
    scored with all heads only, the reason in skipped_reason; its `scored` {task: per-item scores
    (gna.phases.pruning.prefix_scores)} are read for that decision where they hold the table's
    items instead of scoring it first. `per_item`, where given, receives each variant's per-item
    scores by its label (kept_comparisons)."""
    model = scorer.model
    if len(kept_layers) < 2:  # a one-layer "minimal model" has no pair of critical layers
        # all layers instead: the one layer's scores are not theirs
        kept_layers, reference = list(range(model.config.num_hidden_layers)), Reference(chance=reference.chance)
    chance = reference.chance
    (layer_a, head_a), (layer_b, head_b) = critical_heads(ranking, kept_layers)
    n_heads = heads_per_layer(head_sites(model))
    others_a = [(layer_a, h) for h in range(n_heads[layer_a]) if h != head_a]
    others_b = [(layer_b, h) for h in range(n_heads[layer_b]) if h != head_b]
    variants = [
        (ALL_HEADS, "all", "all", []),
        (f"only H{head_a} / only H{head_b}", str(head_a), str(head_b), others_a + others_b),
        (f"∅ / only H{head_b}", "∅", str(head_b), others_a + [(layer_a, head_a)] + others_b),
        (f"only H{head_a} / ∅", str(head_a), "∅", others_a + others_b + [(layer_b, head_b)]),
        ("∅ / ∅", "∅", "∅", others_a + others_b + [(layer_a, head_a), (layer_b, head_b)]),
    ]
    reasons, unablated = {}, {}
    for task, table in tables.items():
        if chance.applies(task):
            base = known_or_scored(scorer, table, reference.scores_of(task), layers=kept_layers)
            reasons[task] = chance.reason(base, table, "removing heads")
            if reasons[task] is not None:
                log.info("heads kept: %s with all heads only, %s", task, reasons[task])
                unablated[task] = base
    ablated_tables = {t: table for t, table in tables.items() if t not in unablated}
    items = (
        score_items(
            scorer,
            ablated_tables,
            {label: ablated for label, _, _, ablated in variants},
            layers=kept_layers,
            desc="heads kept",
        )
        if ablated_tables
        else {}
    )
    if items:  # the all-heads variant's scores also on the tasks only it was scored on
        items[variants[0][0]] = pl.concat([items[variants[0][0]], *unablated.values()])
    elif unablated:
        items = {variants[0][0]: pl.concat(list(unablated.values()))}
    if per_item is not None:
        per_item.update(items)
    summaries = summarize_items(items)
    frames = []
    for label, kept_a, kept_b, _ in variants:
        if label not in summaries:
            continue
        frames.append(
            summaries[label].with_columns(
                _reason_column(reasons),
                pl.lit(label).alias("variant"),
                pl.lit(layer_a).alias("layer_a"),
                pl.lit(kept_a).alias("kept_a"),
                pl.lit(layer_b).alias("layer_b"),
                pl.lit(kept_b).alias("kept_b"),
                pl.lit(len(kept_layers)).alias("layers_kept"),
            )
        )
    return pl.concat(frames)


def kept_comparisons(per_item: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """The heads-kept comparisons (gna.core.paired): every variant against the minimal model with
    all heads, one Holm family."""
    return comparisons(
        per_item, [("variants vs all heads", ALL_HEADS, label) for label in per_item if label != ALL_HEADS]
    )


def dict_size_curves(scorer: Scorer, ranking: pl.DataFrame, table: pl.DataFrame) -> pl.DataFrame:
    """KV accuracy per dictionary size with nothing, the #1 unit (head, or key/value group), or the #2
    removed."""
    unit = ranking_unit(ranking)
    units = ablation_units(scorer.model, unit)
    first, second = top_units(ranking, 2)
    conditions = {
        "none removed": [],
        f"#1 {unit_name(*first, unit)} removed": units[first],
        f"#2 {unit_name(*second, unit)} removed": units[second],
    }
    summaries = _score(scorer, {"kv_retrieval": table}, conditions, desc="dictionary sizes")
    frames = []
    for label in conditions:
        frames.append(
            summaries[label]
            .filter(pl.col("group") != "all")
            .with_columns(pl.lit(label).alias("condition"), pl.col("group").cast(pl.Int64).alias("dict_size"))
        )
    return pl.concat(frames)


@dataclass(frozen=True)
class HeadsTopk(RuleSettings):
    """Settings of rule heads_topk: the `model` (wildcard), the remove-top-k table's `top_k`
    (config section heads: TopK), the items per task (`max_items`: heads.table_max_items; None:
    all), whether KV retrieval's items are a set of their own (`own_kv`: heads.table_kv, whose n is
    kept whole), the `chance` policy (config block chance) and how the model is loaded and scored
    (`evaluation`)."""

    model: str
    top_k: TopK = TopK()
    max_items: int | None = None
    own_kv: bool = False
    chance: ChancePolicy = ChancePolicy()
    evaluation: Evaluation = Evaluation()


def run_heads_topk(inputs: Files, outputs: Files, settings: HeadsTopk) -> pl.DataFrame:
    """Phase heads_topk: remove_top_k of the ranking on the task tables (each cut to
    `max_items` but a KV set of its own); k = 0 is read from the model's per-item baseline scores where given (and, by
    `chance`, whether a task is at chance; never the sweep's own task).
    inputs: model, ranking, tasks, optional baseline (list).
    outputs: summary (the tidy table), comparisons (topk_comparisons), each with a model column."""
    evaluation, model_name = settings.evaluation, settings.model
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    per_item = {}
    result = remove_top_k(
        Scorer(model, tok, evaluation.batch_size),
        read_parquet(inputs.ranking),
        load_task_tables(inputs.tasks, settings.max_items, whole=(SWEEP_TASK,) if settings.own_kv else ()),
        settings.top_k,
        Reference(scored=load_item_scores(inputs.get("baseline", [])), chance=settings.chance.sparing(SWEEP_TASK)),
        per_item=per_item,
    )
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), outputs.summary)
    write_parquet(
        topk_comparisons(per_item, settings.top_k).with_columns(pl.lit(model_name).alias("model")), outputs.comparisons
    )
    log.info("remove top-k: %d rows", len(result))
    return result


@dataclass(frozen=True)
class HeadsKept(RuleSettings):
    """Settings of rule heads_kept: the `model` (wildcard), the items per task (`max_items`:
    heads.table_max_items; None: all), the `chance` policy (config block chance) and how the
    model is loaded and scored (`evaluation`)."""

    model: str
    max_items: int | None = None
    chance: ChancePolicy = ChancePolicy()
    evaluation: Evaluation = Evaluation()


def run_heads_kept(inputs: Files, outputs: Files, settings: HeadsKept) -> pl.DataFrame:
    """Phase heads_kept: heads_kept on the minimal model (gna.phases.pruning's minimal_model
    JSON) and the task tables. The minimal model's own scores are read from gradual pruning's
    per-item scores where they hold the items (prefix_scores).
    inputs: model, ranking, minimal, tasks, optional gradual_items.
    outputs: summary (the tidy table), comparisons (kept_comparisons), each with a model column."""
    evaluation, model_name = settings.evaluation, settings.model
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    kept_layers = read_json(inputs.minimal)["kept_layers"]
    per_item = {}
    result = heads_kept(
        Scorer(model, tok, evaluation.batch_size),
        read_parquet(inputs.ranking),
        kept_layers,
        load_task_tables(inputs.tasks, settings.max_items),
        Reference(
            scored=prefix_scores(inputs.get("gradual_items"), kept_layers), chance=settings.chance.sparing(SWEEP_TASK)
        ),
        per_item=per_item,
    )
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), outputs.summary)
    write_parquet(kept_comparisons(per_item).with_columns(pl.lit(model_name).alias("model")), outputs.comparisons)
    log.info("heads kept: %d rows", len(result))
    return result


@dataclass(frozen=True)
class HeadsDictsize(RuleSettings):
    """Settings of rule heads_dictsize: the `model` (wildcard) and how it is loaded and scored
    (`evaluation`)."""

    model: str
    evaluation: Evaluation = Evaluation()


def run_heads_dictsize(inputs: Files, outputs: Files, settings: HeadsDictsize) -> pl.DataFrame:
    """Phase heads_dictsize: dict_size_curves on the KV prompts of several dictionary sizes
    (data/tasks/prompts/dict_size_curves), written with a model column.
    inputs: model, prompts, ranking; outputs: curves."""
    evaluation = settings.evaluation
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    table = read_parquet(inputs.prompts)
    result = dict_size_curves(Scorer(model, tok, evaluation.batch_size), read_parquet(inputs.ranking), table)
    write_parquet(result.with_columns(pl.lit(settings.model).alias("model")), outputs.curves)
    log.info("dictionary-size curves: %d rows", len(result))
    return result
