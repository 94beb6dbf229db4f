"""Per-head rules: sweep + ranking, attribution pre-ranking, top-k / heads-kept / dict-size tables."""
import json
import time

import polars as pl

from gna.io import read_parquet, write_parquet
from gna.models import load_model
from gna.runtime import peak_rss_mb, setup
from gna.tasks import build_kv_retrieval

log = setup(snakemake.log[0], snakemake.threads)
p = snakemake.params
model_name = snakemake.wildcards.model
model, tok = load_model(snakemake.input.model, p.dtype)
start = time.perf_counter()


def sweep_table():
    return build_kv_retrieval([p.sweep["sweep_dict_size"]], p.sweep["sweep_n"], p.sweep["seed"], p.template)


def task_tables():
    from gna.tasks import subset_evenly as sweep_subset

    tables = {}
    for path in snakemake.input.tasks:
        table = sweep_subset(read_parquet(path), p.max_items)
        tables[table["task"][0]] = table
    return tables


def tag(frame):
    return frame.with_columns(pl.lit(model_name).alias("model"))


if snakemake.rule == "heads_sweep":
    from gna.heads import rank_heads, sweep_heads

    sweep = sweep_heads(model, tok, sweep_table(), batch_size=p.batch_size)
    ranking = rank_heads(sweep)
    write_parquet(tag(sweep), snakemake.output.sweep)
    write_parquet(tag(ranking), snakemake.output.ranking)
    top = ranking.head(10)
    log.info("top-10 heads: %s", ", ".join(f"L{r['layer']}H{r['head']} (-{r['acc_drop']:.2f})" for r in top.iter_rows(named=True)))
elif snakemake.rule == "heads_attribution":
    from gna.heads import attribution_scores, spearman, sweep_heads

    table = sweep_table()
    exact = read_parquet(snakemake.input.ranking)
    t0 = time.perf_counter()
    est = attribution_scores(model, tok, table, batch_size=p.batch_size)
    t_attr = time.perf_counter() - t0
    est = est.sort("logp_drop_est", descending=True).with_columns(pl.int_range(1, len(est) + 1).alias("est_rank"))
    top_n = est.head(p.top_n)
    t0 = time.perf_counter()
    verified = sweep_heads(model, tok, table, heads=list(zip(top_n["layer"], top_n["head"])), batch_size=p.batch_size)
    t_verify = time.perf_counter() - t0
    joined = est.join(exact.select("layer", "head", "acc_drop", "logp_drop", "rank"), on=["layer", "head"], how="left")
    exact_top10 = set(zip(*exact.sort("rank").head(10).select("layer", "head").to_dict(as_series=False).values()))
    recall = len(exact_top10 & set(zip(top_n["layer"], top_n["head"]))) / max(len(exact_top10), 1)
    rho = spearman(joined["logp_drop"].to_list(), joined["logp_drop_est"].to_list())
    joined = joined.with_columns(
        pl.lit(rho).alias("spearman_logp"), pl.lit(recall).alias("recall_top10_in_top_n"),
        pl.lit(p.top_n).alias("top_n"), pl.lit(t_attr).alias("attribution_seconds"),
        pl.lit(t_verify).alias("verify_seconds"),
        pl.col("est_rank").le(p.top_n).alias("verified"))
    write_parquet(tag(joined), snakemake.output[0])
    log.info("attribution: spearman %.3f, recall of exact top-10 in top-%d %.2f, %.1fs + verify %.1fs",
             rho, p.top_n, recall, t_attr, t_verify)
elif snakemake.rule == "heads_topk":
    from gna.head_tables import remove_top_k

    result = remove_top_k(model, tok, read_parquet(snakemake.input.ranking), task_tables(), p.top_k,
                          p.random_draws, p.control_tasks, p.seed, batch_size=p.batch_size)
    write_parquet(tag(result), snakemake.output[0])
elif snakemake.rule == "heads_kept":
    from gna.head_tables import heads_kept

    kept_layers = json.loads(open(snakemake.input.minimal).read())["kept_layers"]
    result = heads_kept(model, tok, read_parquet(snakemake.input.ranking), kept_layers, task_tables(),
                        batch_size=p.batch_size)
    write_parquet(tag(result), snakemake.output[0])
elif snakemake.rule == "heads_dictsize":
    from gna.head_tables import dict_size_curves

    table = build_kv_retrieval(p.sizes, p.n, p.seed, p.template)
    result = dict_size_curves(model, tok, read_parquet(snakemake.input.ranking), table, batch_size=p.batch_size)
    write_parquet(tag(result), snakemake.output[0])
log.info("%s done in %.1fs, peak RSS %.0f MB", snakemake.rule, time.perf_counter() - start, peak_rss_mb())
