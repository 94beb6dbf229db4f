"""The study's MMLU case study on one model, in the study's order: prune layers from the end until
the letter format breaks (the minimal model), remove each of its deepest layers alone (the critical
layers), ablate every query head of those layers alone (the heads found), then keep only those
heads in their layers and remove each (the heads-kept table).

Every selection is made on development MMLU letter items (a draw of their own, never evaluated:
rule case_dev_items) and every reported number on the evaluation items:

* the minimal model: the shallowest prefix shown to hold within the margin of the full model on the
  development items by a fixed sequence (gna.core.paired.shallowest_holding), of those the shallowest
  whose evaluation interval is clear of chance (`choose_minimal`);
* the critical layers: the (at most two) layers whose removal from the minimal model falls most,
  Holm-significant over the layers removed (`choose_critical`);
* the heads found: per critical layer the head whose removal alone costs most, and whether it is on
  top in both halves of the development items (`top_per_layer`);
* the heads-kept table: every head of the other layers, only the heads found in the critical layers,
  each removed and both removed, paired against the kept configuration and against all heads, with
  a random head of the same layer as the control (`kept_variants`).

Scoring reuses the engine's exact prefix reuse (gradual: one pass reads out every depth; removals and
ablations rerun only the layers from theirs on); the references are the naive loops (pruned layers
run as their own model, one forward per ablated head), tested to agree.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import polars as pl

from gna.core.io import read_json, read_parquet, write_json, write_parquet
from gna.core.paired import comparisons, decide, empty, shallowest_holding
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.core.stats import wilson_interval
from gna.engine.ablation import score_ablations
from gna.engine.anatomy import head_sites, heads_per_layer
from gna.engine.scoring import Scorer, Variant, score_variants
from gna.models.prepare import load_model
from gna.phases.head_tables import score_items, summarize_items
from gna.phases.pruning import gradual_comparisons, gradual_items, summarize_gradual
from gna.tasks.tables import load_task_tables

log = logging.getLogger("gna.phases.case_study")

LETTER = "mmlu_letter"  # the format whose fall the case study is about
DEVELOPMENT, EVALUATION = "development", "evaluation"
MINIMAL = "minimal model"  # the reference label of the layer removals and the heads-kept table
ALL_HEADS, KEPT = "all heads", "kept"
REMOVALS_FAMILY = "layer removed vs minimal model"
VS_ALL, VS_KEPT = "vs all heads", "vs kept configuration"


def _split(frame: pl.DataFrame, split: str) -> pl.DataFrame:
    return frame.with_columns(pl.lit(split).alias("split"))


def prune_items(scorer: Scorer, development: pl.DataFrame, tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Per-item scores of every prefix model (gna.phases.pruning.gradual_items) on the development
    letter items and on the evaluation `tables`, with a `split` column (DEVELOPMENT / EVALUATION)."""
    dev = _split(gradual_items(scorer, {LETTER: development}), DEVELOPMENT)
    evaluated = _split(gradual_items(scorer, tables), EVALUATION)
    return pl.concat([dev, evaluated], how="diagonal_relaxed")


def prune_comparisons(items: pl.DataFrame) -> pl.DataFrame:
    """Each prefix against the full model on the same items, one Holm family per split (gradual_comparisons)."""
    frames = [
        _split(gradual_comparisons(part.drop("split")), split)
        for (split,), part in items.partition_by("split", as_dict=True, maintain_order=True).items()
    ]
    return pl.concat(frames) if frames else _split(empty(), DEVELOPMENT)


def _letter_interval(summary: pl.DataFrame, k: int) -> tuple[float, float, float, int] | None:
    rows = summary.filter(
        (pl.col("split") == EVALUATION)
        & (pl.col("task") == LETTER)
        & (pl.col("group") == "all")
        & (pl.col("metric") == "acc")
        & (pl.col("layers_kept") == k)
    )
    if rows.is_empty():
        return None
    value, n = rows["value"][0], int(rows["n"][0])
    low, high = wilson_interval(round(value * n), n)
    return value, low, high, n


def not_broken(row: dict, margin: float) -> bool:
    """Whether a prefix is shown not to break the letter format against the full model (a comparisons row):
    it holds within `margin` (gna.core.paired.decide: a change of either sign inside it), or a fall beyond
    the margin is excluded (the paired difference's 95% lower bound above -margin; a one-sided 2.5% test).
    The study cuts until MMLU breaks: a prefix that answers more questions is not broken, though it does not
    hold two-sided."""
    verdict = decide(row, margin)
    return verdict.verb == "holds" or verdict.within or row["ci_low"] > -margin


def choose_minimal(compared: pl.DataFrame, summary: pl.DataFrame, chance: float, margin: float) -> dict:
    """The minimal model, by a fixed sequence on the development letter items: prefixes tested from the
    deepest down, stopping at the first not shown to be unbroken (not_broken; an order fixed before the
    data keeps the family at 5% without a correction); of those passed, the shallowest whose evaluation
    letter interval (Wilson 95%) lies above `chance`. {n_layers, layers_kept (None where none short of the
    full model qualifies), holding (the shallowest prefix the sequence passed; `two_sided`: the one that
    holds within the margin both ways, gna.core.paired.shallowest_holding), kept_layers, applies, reason,
    the letter interval at that depth, `sequence` (each prefix tested: k, diff, ci_low, lost, gained,
    passed), the prefix one layer shallower}."""
    rows = compared.filter((pl.col("split") == DEVELOPMENT) & (pl.col("task") == LETTER) & (pl.col("group") == "all"))
    n_layers = int(summary["layers_kept"].max())
    by_k = {int(r["condition"].split()[0]): r for r in rows.iter_rows(named=True)}
    sequence, holding = [], None
    for k in sorted(by_k, reverse=True):
        row = by_k[k]
        passed = not_broken(row, margin)
        sequence.append(
            {"layers_kept": k, "diff": row["diff"], "ci_low": row["ci_low"], "ci_high": row["ci_high"],
             "lost": row["reference_only"], "gained": row["condition_only"], "passed": passed}
        )  # fmt: skip
        if not passed:
            break
        holding = k
    clear = [
        k
        for k in range(holding or n_layers, n_layers)
        if (interval := _letter_interval(summary, k)) is not None and interval[1] > chance
    ]
    found = min(clear) if clear else None
    dev_n = int(rows["n"][0]) if len(rows) else 0
    reason = None
    if holding is None:
        first = sequence[0] if sequence else None
        shown = (
            f"the {first['layers_kept']}-layer prefix loses {first['lost']} and gains {first['gained']} of {dev_n} "
            f"development questions ({100 * first['diff']:+.1f} points, 95% interval from {100 * first['ci_low']:+.1f})"
            if first
            else "no prefix was compared"
        )
        reason = (
            f"no prefix short of the full {n_layers} layers is shown not to lose more than {100 * margin:g} points of "
            f"the full model's letter accuracy: {shown}"
        )
    elif found is None:
        reason = (
            f"the prefixes of {holding} to {n_layers - 1} layers are shown not to lose more than {100 * margin:g} "
            f"points on {dev_n} development questions, but none has an evaluation letter interval clear of chance"
        )
    interval = _letter_interval(summary, found if found is not None else n_layers)
    below = by_k.get(found - 1) if found is not None else None
    return {
        "n_layers": n_layers,
        "layers_kept": found,
        "holding": holding,
        "two_sided": shallowest_holding({k: decide(r, margin) for k, r in by_k.items()}),
        "kept_layers": list(range(found)) if found is not None else list(range(n_layers)),
        "applies": found is not None,
        "reason": reason,
        "development_items": dev_n,
        "margin": margin,
        "chance": chance,
        "letter": dict(zip(("value", "ci_low", "ci_high", "n"), interval)) if interval else None,
        "sequence": sequence,
        "shallower": (
            {
                "layers_kept": found - 1,
                "verdict": decide(below, margin).label,
                "diff": below["diff"],
                "ci_low": below["ci_low"],
                "ci_high": below["ci_high"],
            }
            if below is not None
            else None
        ),  # fmt: skip
    }


def removal_items(scorer: Scorer, development: pl.DataFrame, kept_layers: list[int], removed: list[int]) -> dict:
    """{label: per-item scores on the development letter items}: the minimal model made of
    `kept_layers` (MINIMAL) and it without each layer of `removed` ('without L<r>'): one pass records
    the state entering each removed layer, from which its removal runs only the layers after it
    (exact, as gna.engine.scoring.score_removals)."""
    layers = list(kept_layers)
    variants = [Variant(f"without L{r}", r, layers[layers.index(r) + 1 :]) for r in removed]
    return score_variants(scorer, development, layers, variants, "remove one layer", base_key=MINIMAL)


def deepest_layers(kept_layers: list[int], deepest: int | None) -> list[int]:
    """The layers individual removal takes out: the `deepest` last of the minimal model (None: all)."""
    return list(kept_layers) if deepest is None else list(kept_layers)[-deepest:]


def choose_critical(compared: pl.DataFrame, margin: float, most: int = 2) -> tuple[list[int], str | None]:
    """(critical layers in layer order, why there are none): the at most `most` layers whose removal
    makes the letter format fall most (paired test, Holm over the layers removed; a fall inside the
    margin counts), from the removal comparisons (`removal_items` compared against MINIMAL)."""
    rows = compared.filter((pl.col("task") == LETTER) & (pl.col("group") == "all"))
    falling = [r for r in rows.iter_rows(named=True) if decide(r, margin).verb == "falls"]
    falling.sort(key=lambda r: (r["diff"], int(r["condition"].removeprefix("without L"))))
    layers = sorted(int(r["condition"].removeprefix("without L")) for r in falling[:most])
    if layers:
        return layers, None
    n = int(rows["n"][0]) if len(rows) else 0
    removed = f"{len(rows)} layers removed one at a time"
    return [], f"no layer's removal from the minimal model is shown to lower the letter format ({removed}, n = {n})"


def sweep_items(scorer: Scorer, table: pl.DataFrame, kept_layers: list[int], layers: list[int]) -> dict:
    """{(layer, head): per-item scores with that query head ablated alone} for every head of `layers`,
    inside the model made of `kept_layers`, plus {MINIMAL: the model itself}; exact prefix reuse."""
    n_heads = heads_per_layer(head_sites(scorer.model))
    ablations = {MINIMAL: [], **{(layer, h): [(layer, h)] for layer in layers for h in range(n_heads[layer])}}
    return score_ablations(scorer, table, ablations, layers=kept_layers, desc="head sweep")


def sweep_table(frames: dict) -> pl.DataFrame:
    """One row per head: accuracy and mean log-prob of the answer with it ablated, and their drops from
    the unablated model, on all items and on each half (half 1: the items at even positions of the table,
    half 2: at odd ones); rank 1 = largest accuracy drop (log-prob drop breaks ties) within its layer."""
    base = frames[MINIMAL]
    halves = {"": None, "_half1": 0, "_half2": 1}

    def part(frame, half):  # interleaved: the questions are in id order, which groups them by subject
        return frame if half is None else frame.gather_every(2, offset=half)

    rows = []
    for key, frame in frames.items():
        if key == MINIMAL:
            continue
        row = {"layer": key[0], "head": key[1], "n": len(frame)}
        for suffix, half in halves.items():
            mine, ref = part(frame, half), part(base, half)
            row[f"acc{suffix}"] = float(mine["correct"].mean())
            row[f"acc_drop{suffix}"] = float(ref["correct"].mean() - mine["correct"].mean())
            row[f"logp_drop{suffix}"] = float(ref["logp_target"].mean() - mine["logp_target"].mean())
        rows.append(row)
    table = pl.DataFrame(rows)
    for suffix in halves:
        table = table.with_columns(
            pl.struct(f"acc_drop{suffix}", f"logp_drop{suffix}")
            .rank("ordinal", descending=True)
            .over("layer")
            .alias(f"rank{suffix}")
        )
    return table.sort("layer", "rank")


def top_per_layer(sweep: pl.DataFrame) -> list[dict]:
    """Per layer of the sweep: its top head, and whether it is also on top in both halves (`stable`)."""
    found = []
    for (layer,), part in sweep.partition_by("layer", as_dict=True, maintain_order=True).items():
        top = part.filter(pl.col("rank") == 1).row(0, named=True)
        found.append(
            {
                "layer": int(layer),
                "head": int(top["head"]),
                "acc_drop": top["acc_drop"],
                "logp_drop": top["logp_drop"],
                "stable": bool(top["rank_half1"] == 1 and top["rank_half2"] == 1),
                "top_half1": int(part.filter(pl.col("rank_half1") == 1)["head"][0]),
                "top_half2": int(part.filter(pl.col("rank_half2") == 1)["head"][0]),
            }
        )
    return found


@dataclass(frozen=True)
class Control:
    """The random-head control: `draws` heads of each critical layer other than the one found, drawn with `seed`."""

    seed: int = 4321
    draws: int = 1


def kept_variants(found: list[tuple[int, int]], n_heads: dict[int, int], control: Control) -> dict[str, list]:
    """{label: heads ablated} of the heads-kept table on the minimal model: ALL_HEADS; KEPT (in each
    critical layer only its head found, every head of the other layers); KEPT without each head found,
    and without all of them; and per critical layer and draw, the controls: a random other head of the
    layer removed from all heads (beside the head found removed from all heads), and kept in place of
    the head found."""
    others = {layer: [(layer, h) for h in range(n_heads[layer]) if h != head] for layer, head in found}
    kept = [h for layer, _ in found for h in others[layer]]
    variants = {ALL_HEADS: [], KEPT: kept}
    for layer, head in found:
        variants[f"{KEPT} − L{layer}H{head}"] = kept + [(layer, head)]
    if len(found) > 1:
        variants[f"{KEPT} − " + " − ".join(f"L{layer}H{head}" for layer, head in found)] = kept + list(found)
    rng = random.Random(f"case-control-{control.seed}")
    for layer, head in found:
        variants[f"{ALL_HEADS} − L{layer}H{head}"] = [(layer, head)]
        for draw, (_, other) in enumerate(rng.sample(others[layer], min(control.draws, len(others[layer])))):
            variants[f"{ALL_HEADS} − random L{layer}H{other} #{draw}"] = [(layer, other)]
            swapped = [h for h in kept if h != (layer, other)] + [(layer, head)]
            variants[f"{KEPT}, L{layer}H{other} in place of H{head} #{draw}"] = swapped
    return variants


def kept_pairs(labels: list[str]) -> list[tuple[str, str, str]]:
    """The heads-kept comparisons: every variant against all heads (one Holm family), and each
    variant derived from the kept configuration against it (another)."""
    vs_all = [(VS_ALL, ALL_HEADS, label) for label in labels if label != ALL_HEADS]
    vs_kept = [(VS_KEPT, KEPT, label) for label in labels if label.startswith(KEPT) and label != KEPT]
    return vs_all + vs_kept


def by_dict_size(table: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """A KV-retrieval table as one task per dictionary size ('kv_retrieval@<size>'), so that the table
    is summarized and compared size by size."""
    return {
        f"kv_retrieval@{size}": part.with_columns(pl.lit(f"kv_retrieval@{size}").alias("task"))
        for (size,), part in table.partition_by("group", as_dict=True, maintain_order=True).items()
    }


def summarize_variants(items: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Each variant's per-item scores summarized per task (gna.phases.head_tables.summarize_items), with a
    `variant` column."""
    return pl.concat(
        [frame.with_columns(pl.lit(label).alias("variant")) for label, frame in summarize_items(items).items()]
    )


def _scorer(model_path: str, evaluation: Evaluation) -> Scorer:
    """The model at `model_path` loaded and scored as `evaluation` says."""
    model, tok = load_model(model_path, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    return Scorer(model, tok, evaluation.batch_size)


# ---------------------------------------------------------------- rules


@dataclass(frozen=True)
class CasePrune(RuleSettings):
    """Settings of rule case_prune: the `model` (wildcard), the evaluation items per task other than MMLU
    letter (`max_items`: case_study.max_items; None: all) and how the model is loaded and scored
    (`evaluation`)."""

    model: str
    max_items: int | None = None
    evaluation: Evaluation = Evaluation()


def run_case_prune(inputs: Files, outputs: Files, settings: CasePrune) -> pl.DataFrame:
    """Phase case_prune: prune_items on the development letter items and the evaluation tables, its
    summary, per-item scores and comparisons, each with a model column. inputs: model, development, tasks;
    outputs: summary, per_item, comparisons."""
    items = prune_items(
        _scorer(inputs.model, settings.evaluation),
        read_parquet(inputs.development),
        load_task_tables(inputs.tasks, settings.max_items, whole=(LETTER,)),
    )
    summary = pl.concat(
        [
            _split(summarize_gradual(part.drop("split")), split)
            for (split,), part in items.partition_by("split", as_dict=True, maintain_order=True).items()
        ]
    )
    named = pl.lit(settings.model).alias("model")
    write_parquet(items.with_columns(named), outputs.per_item)
    write_parquet(summary.with_columns(named), outputs.summary)
    write_parquet(prune_comparisons(items).with_columns(named), outputs.comparisons)
    log.info("case pruning of %s: %d rows", settings.model, len(summary))
    return summary


@dataclass(frozen=True)
class CaseMinimal(RuleSettings):
    """Settings of rule case_minimal: the `model` (wildcard), `chance` accuracy of the letter format and the
    report's `margin` (report.equivalence_margin)."""

    model: str
    chance: float = 0.25
    margin: float = 0.05


def run_case_minimal(inputs: Files, outputs: Files, settings: CaseMinimal) -> dict:
    """Phase case_minimal: choose_minimal from case_prune's summary and comparisons, written as JSON with the
    model name. inputs: summary, comparisons; outputs: minimal."""
    compared, summary = read_parquet(inputs.comparisons), read_parquet(inputs.summary)
    minimal = {"model": settings.model, **choose_minimal(compared, summary, settings.chance, settings.margin)}
    write_json(minimal, outputs.minimal)
    log.info("minimal model of %s: %s", settings.model, minimal["layers_kept"] or minimal["reason"])
    return minimal


@dataclass(frozen=True)
class CaseLayers(RuleSettings):
    """Settings of rule case_layers: the `model` (wildcard), how many of the minimal model's last layers
    are removed one at a time (`deepest`: case_study.deepest; None: all), the report's `margin` and how
    the model is loaded and scored (`evaluation`)."""

    model: str
    deepest: int | None = None
    margin: float = 0.05
    evaluation: Evaluation = Evaluation()


def run_case_layers(inputs: Files, outputs: Files, settings: CaseLayers) -> dict:
    """Phase case_layers: removal_items inside the minimal model on the development letter items, the
    comparisons against the minimal model (one Holm family) and the critical layers (choose_critical) as
    JSON; where the minimal model does not apply, nothing is scored and the JSON says why.
    inputs: model, development, minimal; outputs: comparisons, critical."""
    minimal = read_json(inputs.minimal)
    critical = {"model": settings.model, "layers": [], "removed": [], "reason": minimal["reason"]}
    compared = empty()
    if minimal["applies"]:
        removed = deepest_layers(minimal["kept_layers"], settings.deepest)
        scorer = _scorer(inputs.model, settings.evaluation)
        frames = removal_items(scorer, read_parquet(inputs.development), minimal["kept_layers"], removed)
        compared = comparisons(frames, [(REMOVALS_FAMILY, MINIMAL, label) for label in frames if label != MINIMAL])
        layers, reason = choose_critical(compared, settings.margin)
        critical |= {"layers": layers, "removed": removed, "reason": reason}
    write_parquet(compared.with_columns(pl.lit(settings.model).alias("model")), outputs.comparisons)
    write_json(critical, outputs.critical)
    log.info("critical layers of %s: %s", settings.model, critical["layers"] or critical["reason"])
    return critical


@dataclass(frozen=True)
class CaseSweep(RuleSettings):
    """Settings of rule case_sweep: the `model` (wildcard) and how it is loaded and scored (`evaluation`)."""

    model: str
    evaluation: Evaluation = Evaluation()


def run_case_sweep(inputs: Files, outputs: Files, settings: CaseSweep) -> dict:
    """Phase case_sweep: every query head of the critical layers ablated alone inside the minimal model
    on the development letter items (sweep_items, sweep_table) and the top head of each layer with its
    stability across the halves (top_per_layer) as JSON; nothing scored where there is no critical
    layer. inputs: model, development, minimal, critical; outputs: sweep, found."""
    minimal, critical = read_json(inputs.minimal), read_json(inputs.critical)
    found = {"model": settings.model, "heads": [], "reason": critical["reason"]}
    sweep = pl.DataFrame(schema={"layer": pl.Int64, "head": pl.Int64, "rank": pl.UInt32})
    if critical["layers"]:
        frames = sweep_items(
            _scorer(inputs.model, settings.evaluation),
            read_parquet(inputs.development),
            minimal["kept_layers"],
            critical["layers"],
        )
        sweep = sweep_table(frames)
        found |= {"heads": top_per_layer(sweep), "n": len(frames[MINIMAL]), "reason": None}
    write_parquet(sweep.with_columns(pl.lit(settings.model).alias("model")), outputs.sweep)
    write_json(found, outputs.found)
    log.info("heads found in %s: %s", settings.model, found["heads"] or found["reason"])
    return found


@dataclass(frozen=True)
class CaseKept(RuleSettings):
    """Settings of rule case_kept: the `model` (wildcard), the evaluation items per task other than MMLU
    letter (`max_items`; None: all), the KV prompts per dictionary size (`kv_per_size`; None: all), the random-head
    `control` (case_study.control) and how the model is loaded and scored (`evaluation`)."""

    model: str
    max_items: int | None = None
    kv_per_size: int | None = None
    control: Control = Control()
    evaluation: Evaluation = Evaluation()


def run_case_kept(inputs: Files, outputs: Files, settings: CaseKept) -> pl.DataFrame:
    """Phase case_kept: the heads-kept table (kept_variants) on the minimal model over the evaluation
    tables and the KV prompts by dictionary size, summarized with a `variant` column, and its
    comparisons (kept_pairs); empty where no head was found.
    inputs: model, minimal, found, tasks, kv; outputs: summary, comparisons."""
    minimal, found = read_json(inputs.minimal), read_json(inputs.found)
    summary, compared = pl.DataFrame(schema={"variant": pl.String, "task": pl.String}), empty()
    if found["heads"]:
        scorer = _scorer(inputs.model, settings.evaluation)
        heads = [(h["layer"], h["head"]) for h in found["heads"]]
        variants = kept_variants(heads, heads_per_layer(head_sites(scorer.model)), settings.control)
        kv = read_parquet(inputs.kv)
        if settings.kv_per_size is not None:
            kv = pl.concat([p.head(settings.kv_per_size) for p in kv.partition_by("group", maintain_order=True)])
        tables = {**load_task_tables(inputs.tasks, settings.max_items, whole=(LETTER,)), **by_dict_size(kv)}
        items = score_items(scorer, tables, variants, layers=minimal["kept_layers"], desc="heads kept")
        summary = summarize_variants(items)
        compared = comparisons(items, kept_pairs(list(variants)))
    named = pl.lit(settings.model).alias("model")
    write_parquet(summary.with_columns(named), outputs.summary)
    write_parquet(compared.with_columns(named), outputs.comparisons)
    log.info("heads kept: %d rows", len(summary))
    return summary
