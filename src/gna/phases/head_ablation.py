"""Per-head ablation experiments: the exact sweep and its ranking, the attribution pre-ranking
and how well it agrees with the exact sweep, and the workflow phases heads_sweep and
heads_attribution that run them on KV-retrieval prompts.

Heads and their ablation hooks are gna.engine.hooks; the sweep scores every head through the engine's
prefix reuse (gna.engine.ablation.score_ablations), with one full forward per head as the reference.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from gna.core.io import read_parquet, write_json, write_parquet
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.engine.ablation import SWEEP_UNITS, ablation_units, ranking_unit, score_ablations, unit_name
from gna.engine.anatomy import HeadSite, decoder_layers, head_sites, site_of
from gna.engine.device import device_of
from gna.engine.hooks import ablate_heads
from gna.engine.scoring import Scorer, score_batches, score_table
from gna.engine.stack import check_engine
from gna.models.prepare import load_model

log = logging.getLogger("gna.phases.head_ablation")


def _summary(frame: pl.DataFrame) -> dict:
    return {"acc": float(frame["correct"].mean()), "mean_logp": float(frame["logp_target"].mean()), "n": len(frame)}


def _query_heads_per_group(model) -> int:
    """The reference's own count, from the config alone (kv_groups reads the head sites)."""
    config = model.config
    return config.num_attention_heads // getattr(config, "num_key_value_heads", config.num_attention_heads)


def sweep_heads(
    scorer: Scorer, table: pl.DataFrame, heads: list[tuple[int, int]] | None = None, unit: str = "head"
) -> pl.DataFrame:
    """Ablate each unit alone (ablation_units: a head, or a key/value group's query heads together);
    accuracy and mean log-prob of the correct choice per unit, `heads` (default: every unit) naming
    the units measured by (layer, index).

    Exact for every family the engine runs: the hidden state entering layer L is computed once
    per batch and only layers L..end rerun for that layer's units (score_ablations).
    Returns one row per unit (layer, head = the unit's index, unit, query_heads: the query heads
    ablated) plus a row with layer = head = -1 for the unablated model, scored from the same
    recorded pass."""
    sites = head_sites(scorer.model)
    units = ablation_units(scorer.model, unit)
    keys = heads if heads is not None else list(units)
    frames = score_ablations(scorer, table, {"base": [], **{key: units[key] for key in keys}}, desc=f"{unit} sweep")
    rows = [{"layer": -1, "head": -1, "kind": "none", "unit": unit, "query_heads": [], **_summary(frames["base"])}]
    rows += [
        {
            "layer": layer,
            "head": index,
            "kind": site_of(sites, *units[layer, index][0])[0].kind,
            "unit": unit,
            "query_heads": [h for _, h in units[layer, index]],
            **_summary(frames[(layer, index)]),
        }
        for layer, index in keys
    ]
    return pl.DataFrame(rows, schema_overrides={"query_heads": pl.List(pl.Int64)})


def sweep_cost(heads: list[tuple[int, int]], n_layers: int) -> int:
    """The exact sweep's cost of `heads` in layer runs per batch: a head of layer L reruns
    layers L..end (the shared base pass is left out: every mode pays it once)."""
    return sum(n_layers - layer for layer, _ in heads)


def sweep_heads_naive(
    scorer: Scorer, table: pl.DataFrame, heads: list[tuple[int, int]], sites=None, unit: str = "head"
) -> dict:
    """Reference: one full forward of the whole model per ablated unit (ablation_units: a head, or a
    key/value group's query heads written out one by one here); {(layer, index): per-item frame}."""
    model = scorer.model
    sites = sites or head_sites(model)
    per = _query_heads_per_group(model) if unit == "group" else 1
    quiet = replace(scorer, progress=False)  # one bar over the units, none per unit
    out = {}
    for layer, head in tqdm(heads, desc=f"{unit} sweep (naive)", disable=not scorer.progress, mininterval=2.0):
        with ablate_heads(model, [(layer, h) for h in range(head * per, (head + 1) * per)], sites):
            out[(layer, head)] = score_table(quiet, table)
    return out


def rank_heads(sweep: pl.DataFrame) -> pl.DataFrame:
    """acc_drop / logp_drop against the unablated row; rank 1 = most harmful to remove
    (accuracy drop first, log-prob drop breaks ties)."""
    base = sweep.filter(pl.col("layer") == -1).row(0, named=True)
    heads = (
        sweep.filter(pl.col("layer") >= 0)
        .with_columns(
            (base["acc"] - pl.col("acc")).alias("acc_drop"),
            (base["mean_logp"] - pl.col("mean_logp")).alias("logp_drop"),
        )
        .sort(["acc_drop", "logp_drop", "layer", "head"], descending=[True, True, False, False])
    )
    return heads.with_columns(pl.int_range(1, len(heads) + 1).alias("rank"))


ATTRIBUTION_BATCH = 2  # sequences per forward and backward of the attribution pass (memory, above)


def attribution_scores(scorer: Scorer, table: pl.DataFrame, grad_drop: bool = False) -> pl.DataFrame:
    """Attribution patching: a linear estimate of every head's ablation effect on the mean
    log-prob of the correct choice, from one forward and one backward pass per batch.

    For head output z (its slice of the site's input) and gradient g of the metric, zeroing z
    changes the metric by about -<g, z>; the estimated drop is <g, z> summed over positions
    (column logp_drop_est).

    grad_drop adds AtP*'s GradDrop correction (Kramár et al. 2024), column graddrop_est: for
    each layer l, the estimate recomputed with the gradient through layer l's own output dropped
    (only the residual path carries it past l), and the head's score is the sum over l of the
    magnitudes. A head whose paths cancel in the plain estimate (a gather head feeding
    later heads) still scores high. Costs one partial backward per layer: layers 0..l-1 for l."""
    model = scorer.model
    check_engine(model)  # its probe runs before the hooks below are installed
    sites = head_sites(model)
    n_layers = len(decoder_layers(model))
    targets = table["target"].to_list()
    on = {"dtype": torch.float64, "device": device_of(model)}
    est = {s: torch.zeros(s.n_heads, **on) for s in sites}
    # dropped[l][site]: the signed estimate with layer l's own gradient dropped, for sites below l
    dropped = [{s: torch.zeros(s.n_heads, **on) for s in sites if s.layer < l} for l in range(n_layers)]
    captured: dict[HeadSite, torch.Tensor] = {}

    def capture(site):
        def hook(module, args):
            if args[0].requires_grad:
                args[0].retain_grad()
                captured[site] = args[0]

        return hook

    def per_head(site: HeadSite, z: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        shape = (*z.shape[:-1], site.n_heads, site.head_dim)
        return (z.detach().reshape(shape) * grad.reshape(shape)).sum(dim=(0, 1, 3)).double()

    def forward(stack, batch, units):
        # the target choice's log-prob; with one choice per sequence, other choices weigh 0
        local = [u.choices.index(targets[u.row]) if targets[u.row] in u.choices else 0 for u in units]
        weight = torch.tensor([float(targets[u.row] in u.choices) for u in units], device=batch.ids.device)
        run = stack.record(batch, keep=set(range(1, n_layers)) if grad_drop else set())
        # the residual stream after each layer: entering[l + 1], and the final state after the last
        after = [run.entering[l + 1] for l in range(n_layers - 1)] + [run.final] if grad_drop else []
        for h in after:
            h.retain_grad()
        logp = stack.target_logprob(run.final, batch, local)
        ((logp * weight).sum() / len(table)).backward(retain_graph=grad_drop)
        for s in sites:
            if captured[s].grad is not None:  # no gradient: the metric does not depend on the site
                est[s] += per_head(s, captured[s], captured[s].grad)
        for l in range(1, n_layers) if grad_drop else ():
            below = [s for s in sites if s.layer < l]
            # dropping layer l's own gradient leaves the gradient after l to reach the state before it
            grads = torch.autograd.grad(
                (run.entering[l] * after[l].grad).sum(),
                [captured[s] for s in below],
                retain_graph=True,
                allow_unused=True,
            )
            for s, g in zip(below, grads):
                if g is not None:  # a site the state before l does not depend on estimates 0
                    dropped[l][s] += per_head(s, captured[s], g)
        captured.clear()
        model.zero_grad(set_to_none=True)
        return {}

    def grad_from_embeddings(module, args, out):  # the weights may be frozen: gradients start here
        return out.detach().requires_grad_(True) if torch.is_grad_enabled() else out

    handles = [s.module.register_forward_pre_hook(capture(s)) for s in sites]
    handles.append(model.get_input_embeddings().register_forward_hook(grad_from_embeddings))
    try:
        # the backward keeps every layer's activations: in small batches (the estimate is a sum over
        # them) the 1.5B model's pass peaks at 10.7 GB instead of 14.3 at 8, and runs faster
        small = replace(scorer, batch_size=min(scorer.batch_size, ATTRIBUTION_BATCH))
        score_batches(small, table, forward, desc="attribution", grad=True)
    finally:
        for handle in handles:
            handle.remove()
    rows = []
    for s in sites:
        for h in range(s.n_heads):
            row = {"layer": s.layer, "head": s.offset + h, "kind": s.kind, "logp_drop_est": float(est[s][h])}
            if grad_drop:
                # l below the head's layer: the plain estimate; l = its layer: 0 (its output dropped)
                row["graddrop_est"] = s.layer * abs(row["logp_drop_est"]) + sum(
                    abs(float(dropped[l][s][h])) for l in range(s.layer + 1, n_layers)
                )
            rows.append(row)
    return pl.DataFrame(rows)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation of two equally long lists."""
    from scipy.stats import spearmanr  # scipy.stats takes 0.6 s to import: only the attribution check needs it

    return float(spearmanr(np.asarray(a), np.asarray(b)).statistic)


ESTIMATE_ORDERS = {"signed": "logp_drop_est", "magnitude": "logp_drop_est", "graddrop": "graddrop_est"}


def rank_attribution(est: pl.DataFrame, order: str = "signed") -> pl.DataFrame:
    """attribution_scores sorted largest first, with est_rank (1 = largest): by the estimated drop
    (`signed`), by its magnitude (`magnitude`: a head whose removal the linear estimate gets
    wrong in sign is still a candidate), or by the GradDrop score (`graddrop`)."""
    if order not in ESTIMATE_ORDERS:
        raise ValueError(f"unknown attribution order {order!r}; one of {sorted(ESTIMATE_ORDERS)}")
    key = pl.col(ESTIMATE_ORDERS[order])
    key = key.abs() if order == "magnitude" else key
    # ties (e.g. heads with no gradient) broken by the estimate's magnitude, then layer and head,
    # so the order never depends on the row order of the input
    return est.sort(
        [key, pl.col("logp_drop_est").abs(), "layer", "head"], descending=[True, True, False, False]
    ).with_columns(pl.int_range(1, len(est) + 1).alias("est_rank"))


def attribution_cost(n_layers: int, order: str) -> int:
    """The attribution's cost in layer runs (sweep_cost's unit): a forward and a backward, about
    3 passes over every layer; GradDrop adds one backward from each layer's input down to the
    embeddings (2 * (1 + ... + n_layers - 1) layer runs)."""
    return 3 * n_layers + (n_layers * (n_layers - 1) if order == "graddrop" else 0)


def within_budget(
    ranked_est: pl.DataFrame, n_layers: int, budget: float, order: str = "magnitude"
) -> list[tuple[int, int]]:
    """The heads of a ranked estimate, in its order, whose exact sweep fits in `budget` (a share
    of the full sweep's cost, sweep_cost) less the cost of the attribution that ranked them with
    `order` (attribution_cost)."""
    heads = top_heads(ranked_est, len(ranked_est))
    allowed = budget * sweep_cost(heads, n_layers) - attribution_cost(n_layers, order)
    chosen, spent = [], 0
    for layer, head in heads:
        spent += n_layers - layer
        if spent > allowed:
            break
        chosen.append((layer, head))
    return chosen


def unit_attribution(est: pl.DataFrame, units: dict[tuple[int, int], list[tuple[int, int]]]) -> pl.DataFrame:
    """attribution_scores per unit (ablation_units): a unit's estimated drop is the sum of its query
    heads' (the estimate is linear in the ablated outputs, so removing them together sums them; the
    GradDrop score is summed too, an upper bound of the group's own), with `head` = the unit's index."""
    index = {head: key for key, heads in units.items() for head in heads}
    if all(len(heads) == 1 for heads in units.values()):
        return est
    keys = [index[(layer, head)] for layer, head in zip(est["layer"].to_list(), est["head"].to_list())]
    sums = [c for c in ("logp_drop_est", "graddrop_est") if c in est.columns]
    return (
        est.with_columns(pl.Series("head", [k[1] for k in keys]))
        .group_by("layer", "head", maintain_order=True)
        .agg(pl.col("kind").first(), *[pl.col(c).sum() for c in sums])
    )


def sweep_heads_verified(
    scorer: Scorer,
    table: pl.DataFrame,
    budget: float = 0.2,
    order: str = "magnitude",
    min_heads: int = 2,
    unit: str = "head",
) -> pl.DataFrame:
    """The sweep's fast mode: rank every unit (ablation_units: heads, or key/value groups) by
    attribution (unit_attribution, ranked by rank_attribution with `order`), then sweep exactly, in
    that order, the units that fit in `budget` of the full sweep's cost (within_budget). Returns
    sweep_heads' rows for the unablated model and the verified units only (their numbers are exact);
    the units left out were not measured, and rank_heads ranks the verified ones. Fewer than
    `min_heads` verified units is an error naming the budget.
    benchmarks/head_sweep_speed.py measures how many of the full sweep's top 10 heads it finds, and at
    what share of its time."""
    model = scorer.model
    est = unit_attribution(
        attribution_scores(scorer, table, grad_drop=order == "graddrop"), ablation_units(model, unit)
    )
    n_layers = len(decoder_layers(model))
    chosen = within_budget(rank_attribution(est, order), n_layers, budget, order)
    if len(chosen) < min_heads:
        share = attribution_cost(n_layers, order) / sweep_cost(list(ablation_units(model, unit)), n_layers)
        raise ValueError(
            f"heads.verify_budget={budget} verifies {len(chosen)} {unit}s, fewer than the {min_heads} "
            f"needed: the attribution ({order}) alone costs {share:.0%} of the exact sweep on this "
            f"model; raise heads.verify_budget or use heads.sweep_mode: exact"
        )
    return sweep_heads(scorer, table, heads=chosen, unit=unit)


def top_heads(frame: pl.DataFrame, n: int) -> list[tuple[int, int]]:
    """(layer, head) of the first `n` rows of a ranked head table."""
    top = frame.head(n)
    return list(zip(top["layer"].to_list(), top["head"].to_list()))


def compare_attribution(ranked_est: pl.DataFrame, exact: pl.DataFrame, top_n: int) -> pl.DataFrame:
    """The attribution pre-ranking against the exact sweep: `ranked_est` (rank_attribution)
    joined with the exact acc_drop, logp_drop and rank (rank_heads) of each head, plus
    spearman_logp (estimated vs exact log-prob drop over the heads), recall_top10_in_top_n (share
    of the exact top 10 among the estimate's top `top_n`), top_n and `verified` (the head is in the estimate's top
    `top_n`)."""
    missing = ranked_est.join(exact, on=["layer", "head"], how="anti")
    if not missing.is_empty():
        raise ValueError(
            f"the attribution check needs the exact sweep of every head; {len(missing)} of "
            f"{len(ranked_est)} heads have no exact result (heads.sweep_mode must be 'exact')"
        )
    joined = ranked_est.join(
        exact.select("layer", "head", "acc_drop", "logp_drop", "rank"), on=["layer", "head"], how="left"
    )
    exact_top10 = set(top_heads(exact.sort("rank"), 10))
    recall = len(exact_top10 & set(top_heads(ranked_est, top_n))) / max(len(exact_top10), 1)
    rho = spearman(joined["logp_drop"].to_list(), joined["logp_drop_est"].to_list())
    return joined.with_columns(
        pl.lit(rho).alias("spearman_logp"),
        pl.lit(recall).alias("recall_top10_in_top_n"),
        pl.lit(top_n).alias("top_n"),
        pl.col("est_rank").le(top_n).alias("verified"),
    )


SWEEP_MODES = ("exact", "verified")


@dataclass(frozen=True)
class SweepMode:
    """How heads_sweep sweeps (config section heads): `mode` exact (every unit ablated alone) or
    verified (heads.sweep_mode), the unit ablated (`unit`: heads.sweep_unit, ablation_units); in
    verified mode the share of the exact sweep's cost spent (`budget`: heads.verify_budget) and the
    attribution order of the pre-ranking (`order`: heads.verify_order; sweep_heads_verified)."""

    mode: str = "exact"
    budget: float = 0.2
    order: str = "magnitude"
    unit: str = "head"

    def __post_init__(self):
        if self.mode not in SWEEP_MODES:
            raise ValueError(f"heads.sweep_mode: unknown mode {self.mode!r}; one of {SWEEP_MODES}")
        if self.unit not in SWEEP_UNITS:
            raise ValueError(f"heads.sweep_unit: unknown unit {self.unit!r}; one of {', '.join(SWEEP_UNITS)}")


@dataclass(frozen=True)
class HeadsSweep(RuleSettings):
    """Settings of rule heads_sweep: the `model` (wildcard), how it sweeps (`sweep`: SweepMode)
    and how the model is loaded and scored (`evaluation`)."""

    model: str
    sweep: SweepMode = SweepMode()
    evaluation: Evaluation = Evaluation()


def run_heads_sweep(inputs: Files, outputs: Files, settings: HeadsSweep) -> pl.DataFrame:
    """Phase heads_sweep on the sweep prompts (data/tasks/prompts/head_sweep): `sweep.mode` exact
    (sweep_heads over every unit of `sweep.unit`) or verified (sweep_heads_verified with
    `sweep.budget` and `sweep.order`), written with the mode and the model's number of units
    (heads_total: heads, or key/value groups), and its rank_heads (both with a model column).
    inputs: model, prompts; outputs: sweep, ranking."""
    evaluation, sweep, model_name = settings.evaluation, settings.sweep, settings.model
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    table = read_parquet(inputs.prompts)
    scorer = Scorer(model, tok, evaluation.batch_size)
    if sweep.mode == "exact":
        result = sweep_heads(scorer, table, unit=sweep.unit)
    else:
        result = sweep_heads_verified(scorer, table, sweep.budget, sweep.order, unit=sweep.unit)
    ranking = rank_heads(result)
    n_units = len(ablation_units(model, sweep.unit))
    # the task the heads were ablated on (KV retrieval, or MMLU letter development questions)
    result = result.with_columns(
        pl.lit(sweep.mode).alias("mode"),
        pl.lit(n_units).alias("heads_total"),
        pl.lit(table["task"][0]).alias("task"),
        # the sweep prompts' dictionary size (KV retrieval; null for MMLU questions)
        pl.lit(int(table["dict_size"][0]) if "dict_size" in table.columns else None, dtype=pl.Int64).alias("dict_size"),
    )
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), outputs.sweep)
    write_parquet(ranking.with_columns(pl.lit(model_name).alias("model")), outputs.ranking)
    log.info(
        "%s sweep, %d of %d %ss measured; top 10: %s",
        sweep.mode,
        len(ranking),
        n_units,
        sweep.unit,
        ", ".join(
            f"{unit_name(r['layer'], r['head'], sweep.unit)} (-{r['acc_drop']:.2f})"
            for r in ranking.head(10).iter_rows(named=True)
        ),
    )
    return ranking


@dataclass(frozen=True)
class HeadsAttribution(RuleSettings):
    """Settings of rule heads_attribution: the `model` (wildcard), the estimate's top heads swept
    exactly (`top_n`: heads.attribution_top_n), the attribution order (`order`:
    heads.verify_order; rank_attribution) and how the model is loaded and scored
    (`evaluation`)."""

    model: str
    top_n: int = 30
    order: str = "magnitude"
    evaluation: Evaluation = Evaluation()


def run_heads_attribution(inputs: Files, outputs: Files, settings: HeadsAttribution) -> pl.DataFrame:
    """Phase heads_attribution: attribution_scores on the sweep's prompts ranked by `order`
    (rank_attribution) and compare_attribution against the exact ranking — per key/value group where
    the ranking ranks groups (unit_attribution); written with a model column. The attribution's wall
    time goes to the timings log (JSON: timings are not results); verifying the estimate's top
    `top_n` would rerun rows the exact sweep already holds, so its cost is logged as their share
    of the sweep's (sweep_cost), not measured again.
    inputs: model, prompts, ranking; outputs: attribution, timings (the rule's log of that name)."""
    evaluation, order, top_n = settings.evaluation, settings.order, settings.top_n
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    table, exact = read_parquet(inputs.prompts), read_parquet(inputs.ranking)
    unit = ranking_unit(exact)  # a ranking of key/value groups is checked against the groups' estimates
    scorer = Scorer(model, tok, evaluation.batch_size)
    start = time.perf_counter()
    units = ablation_units(model, unit)
    est = unit_attribution(attribution_scores(scorer, table, grad_drop=order == "graddrop"), units)
    ranked = rank_attribution(est, order)
    t_attr = time.perf_counter() - start
    n_layers = len(decoder_layers(model))
    verify_share = sweep_cost(top_heads(ranked, top_n), n_layers) / sweep_cost(list(units), n_layers)
    result = compare_attribution(ranked, exact, top_n).with_columns(pl.lit(order).alias("order"))
    write_parquet(result.with_columns(pl.lit(settings.model).alias("model")), outputs.attribution)
    write_json({"attribution": round(t_attr, 2)}, outputs.timings)
    log.info(
        "attribution: spearman %.3f, recall of exact top-10 in top-%d %.2f, %.1fs; verifying the top %d costs "
        "%.0f%% of the exact sweep",
        result["spearman_logp"][0],
        top_n,
        result["recall_top10_in_top_n"][0],
        t_attr,
        top_n,
        100 * verify_share,
    )
    return result
