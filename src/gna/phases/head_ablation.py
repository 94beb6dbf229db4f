"""Per-head ablation experiments: the exact sweep and its ranking, the attribution pre-ranking
and how well it agrees with the exact sweep, and the workflow phases heads_sweep and
heads_attribution that run them on KV-retrieval prompts.

Heads and their ablation hooks are gna.engine.hooks; the sweep scores every head through the engine's
prefix reuse (gna.engine.scoring.score_variants), with one full forward per head as the reference.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import polars as pl
import torch
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from gna.engine.device import device_of
from gna.engine.hooks import HeadSite, ablate_heads, all_heads, head_sites, site_of
from gna.core.io import read_parquet, write_json, write_parquet
from gna.models.prepare import load_model
from gna.engine.scoring import Variant, run_batches, score_table, score_variants
from gna.engine.stack import check_engine, decoder_layers
from gna.tasks.tables import build_kv_retrieval

log = logging.getLogger("gna.phases.head_ablation")


def _summary(frame: pl.DataFrame) -> dict:
    return {"acc": float(frame["correct"].mean()), "mean_logp": float(frame["logp_target"].mean()),
            "n": len(frame)}


def sweep_heads(model, tok, table: pl.DataFrame, heads: list[tuple[int, int]] | None = None, batch_size: int = 8,
                progress: bool = True) -> pl.DataFrame:
    """Ablate each head alone; accuracy and mean log-prob of the correct choice per head.

    Exact for every family the engine runs: the hidden state entering layer L is computed once
    per batch and only layers L..end rerun for that layer's heads (gna.engine.scoring.score_variants).
    Returns one row per head plus a row with layer = head = -1 for the unablated model."""
    sites = head_sites(model)
    heads = heads if heads is not None else all_heads(model)
    base = score_table(model, tok, table, batch_size=batch_size, progress=False)
    layers = list(range(len(decoder_layers(model))))
    variants = [Variant((layer, head), layer, layers[layer:],
                        context=lambda layer=layer, head=head: ablate_heads(model, [(layer, head)], sites))
                for layer, head in heads]
    frames = score_variants(model, tok, table, layers, variants, batch_size, progress, desc="head sweep")
    rows = [{"layer": -1, "head": -1, "kind": "none", **_summary(base)}]
    rows += [{"layer": layer, "head": head, "kind": site_of(sites, layer, head)[0].kind,
              **_summary(frames[(layer, head)])} for layer, head in heads]
    return pl.DataFrame(rows)


def sweep_heads_naive(model, tok, table: pl.DataFrame, heads: list[tuple[int, int]], batch_size: int = 8,
                      progress: bool = True, sites=None) -> dict:
    """Reference: one full forward of the whole model per ablated head; {(layer, head): per-item frame}."""
    sites = sites or head_sites(model)
    out = {}
    for layer, head in tqdm(heads, desc="head sweep (naive)", disable=not progress, mininterval=2.0):
        with ablate_heads(model, [(layer, head)], sites):
            out[(layer, head)] = score_table(model, tok, table, batch_size=batch_size, progress=False)
    return out


def rank_heads(sweep: pl.DataFrame) -> pl.DataFrame:
    """acc_drop / logp_drop against the unablated row; rank 1 = most harmful to remove
    (accuracy drop first, log-prob drop breaks ties)."""
    base = sweep.filter(pl.col("layer") == -1).row(0, named=True)
    heads = sweep.filter(pl.col("layer") >= 0).with_columns(
        (base["acc"] - pl.col("acc")).alias("acc_drop"),
        (base["mean_logp"] - pl.col("mean_logp")).alias("logp_drop"),
    ).sort(["acc_drop", "logp_drop", "layer", "head"], descending=[True, True, False, False])
    return heads.with_columns(pl.int_range(1, len(heads) + 1).alias("rank"))


def attribution_scores(model, tok, table: pl.DataFrame, batch_size: int = 8, progress: bool = True) -> pl.DataFrame:
    """Attribution patching: a linear estimate of every head's ablation effect on the mean
    log-prob of the correct choice, from one forward and one backward pass per batch.

    For head output z (its slice of the site's input) and gradient g of the metric, zeroing z
    changes the metric by about -<g, z>; the estimated drop is <g, z> summed over positions."""
    check_engine(model)  # its probe runs before the hooks below are installed
    sites = head_sites(model)
    targets = table["target"].to_list()
    est = {s: torch.zeros(s.n_heads, dtype=torch.float64, device=device_of(model)) for s in sites}
    captured: dict[HeadSite, torch.Tensor] = {}

    def capture(site):
        def hook(module, args):
            if args[0].requires_grad:
                args[0].retain_grad()
                captured[site] = args[0]
        return hook

    def forward(stack, batch, units):
        # the target choice's log-prob; with one choice per sequence, other choices weigh 0
        local = [u.choices.index(targets[u.row]) if targets[u.row] in u.choices else 0 for u in units]
        weight = torch.tensor([float(targets[u.row] in u.choices) for u in units], device=batch.ids.device)
        run = stack.record(batch, keep=set())
        logp = stack.target_logprob(run.final, batch, local)
        ((logp * weight).sum() / len(table)).backward()
        for s in sites:
            z = captured.pop(s)
            shape = (*z.shape[:-1], s.n_heads, s.head_dim)
            est[s] += (z.detach().reshape(shape) * z.grad.reshape(shape)).sum(dim=(0, 1, 3)).double()
        model.zero_grad(set_to_none=True)
        return {}

    def grad_from_embeddings(module, args, out):  # the weights may be frozen: gradients start here
        return out.detach().requires_grad_(True) if torch.is_grad_enabled() else out

    handles = [s.module.register_forward_pre_hook(capture(s)) for s in sites]
    handles.append(model.get_input_embeddings().register_forward_hook(grad_from_embeddings))
    try:
        run_batches(model, tok, table, forward, batch_size, progress, desc="attribution", grad=True)
    finally:
        for handle in handles:
            handle.remove()
    rows = [{"layer": s.layer, "head": s.offset + h, "kind": s.kind, "logp_drop_est": float(est[s][h])}
            for s in sites for h in range(s.n_heads)]
    return pl.DataFrame(rows)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation of two equally long lists."""
    return float(spearmanr(np.asarray(a), np.asarray(b)).statistic)


def rank_attribution(est: pl.DataFrame) -> pl.DataFrame:
    """attribution_scores sorted by estimated drop, largest first, with est_rank (1 = largest)."""
    return est.sort("logp_drop_est", descending=True).with_columns(pl.int_range(1, len(est) + 1).alias("est_rank"))


def top_heads(frame: pl.DataFrame, n: int) -> list[tuple[int, int]]:
    """(layer, head) of the first `n` rows of a ranked head table."""
    top = frame.head(n)
    return list(zip(top["layer"].to_list(), top["head"].to_list()))


def compare_attribution(ranked_est: pl.DataFrame, exact: pl.DataFrame, top_n: int) -> pl.DataFrame:
    """The attribution pre-ranking against the exact sweep: `ranked_est` (rank_attribution)
    joined with the exact acc_drop, logp_drop and rank (rank_heads) of each head, plus
    spearman_logp (estimated vs exact log-prob drop over the heads), recall_top10_in_top_n (share
    of the exact top 10 among the estimate's top `top_n`), top_n and `verified` (the head is in the estimate's top `top_n`)."""
    joined = ranked_est.join(exact.select("layer", "head", "acc_drop", "logp_drop", "rank"), on=["layer", "head"],
                             how="left")
    exact_top10 = set(top_heads(exact.sort("rank"), 10))
    recall = len(exact_top10 & set(top_heads(ranked_est, top_n))) / max(len(exact_top10), 1)
    rho = spearman(joined["logp_drop"].to_list(), joined["logp_drop_est"].to_list())
    return joined.with_columns(
        pl.lit(rho).alias("spearman_logp"), pl.lit(recall).alias("recall_top10_in_top_n"),
        pl.lit(top_n).alias("top_n"),
        pl.col("est_rank").le(top_n).alias("verified"))


def sweep_task(sweep: dict, template: str) -> pl.DataFrame:
    """The KV-retrieval prompts of the head sweep, from the `heads` config keys sweep_dict_size,
    sweep_n and seed."""
    return build_kv_retrieval([sweep["sweep_dict_size"]], sweep["sweep_n"], sweep["seed"], template)


def run_heads_sweep(model_name: str, model_dir: str, sweep_path: str, ranking_path: str, sweep: dict,
                    template: str, batch_size: int = 8, dtype: str = "float32") -> pl.DataFrame:
    """Phase heads_sweep: sweep_heads over every head of the prepared model on sweep_task, written
    to `sweep_path`, and its rank_heads to `ranking_path` (both with a model column)."""
    model, tok = load_model(model_dir, dtype)
    result = sweep_heads(model, tok, sweep_task(sweep, template), batch_size=batch_size)
    ranking = rank_heads(result)
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), sweep_path)
    write_parquet(ranking.with_columns(pl.lit(model_name).alias("model")), ranking_path)
    log.info("top-10 heads: %s", ", ".join(f"L{r['layer']}H{r['head']} (-{r['acc_drop']:.2f})"
                                           for r in ranking.head(10).iter_rows(named=True)))
    return ranking


def run_heads_attribution(model_name: str, model_dir: str, ranking_path: str, out_path: str, timings_path: str,
                          sweep: dict, template: str, top_n: int, batch_size: int = 8,
                          dtype: str = "float32") -> pl.DataFrame:
    """Phase heads_attribution: attribution_scores on sweep_task, the exact sweep of the estimate's
    top `top_n` heads (the cost of verifying a pre-ranking), and compare_attribution against the
    exact ranking in `ranking_path`; written to `out_path` with a model column. The two parts'
    wall times go to `timings_path` (JSON, a log: timings are not results)."""
    model, tok = load_model(model_dir, dtype)
    table = sweep_task(sweep, template)
    start = time.perf_counter()
    ranked = rank_attribution(attribution_scores(model, tok, table, batch_size=batch_size))
    t_attr = time.perf_counter() - start
    start = time.perf_counter()
    sweep_heads(model, tok, table, heads=top_heads(ranked, top_n), batch_size=batch_size)
    t_verify = time.perf_counter() - start
    result = compare_attribution(ranked, read_parquet(ranking_path), top_n)
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), out_path)
    write_json({"attribution": round(t_attr, 2), f"verify top {top_n}": round(t_verify, 2)}, timings_path)
    log.info("attribution: spearman %.3f, recall of exact top-10 in top-%d %.2f, %.1fs + verify %.1fs",
             result["spearman_logp"][0], top_n, result["recall_top10_in_top_n"][0], t_attr, t_verify)
    return result
