"""Layer-pruning rules: gradual sweep, minimal model, individual removal."""
import json

from gna.io import read_parquet, write_json, write_parquet
from gna.runtime import setup

log = setup(snakemake.log[0], snakemake.threads)
model_name = snakemake.wildcards.model

if snakemake.rule == "minimal_model":
    from gna.pruning import minimal_prefix

    p = snakemake.params
    best = minimal_prefix(read_parquet(snakemake.input[0]), p.task, p.metric, p.fraction)
    write_json({"model": model_name, **best}, snakemake.output[0])
    log.info("minimal model of %s: %d of %d layers (%s %s %.3f vs full %.3f)", model_name, best["layers_kept"],
             best["n_layers"], best["task"], best["metric"], best["value"], best["full_value"])
else:
    from gna.models import load_model
    from gna.pruning import gradual, individual
    from gna.tasks import subset_evenly as sweep_subset
    import polars as pl

    model, tok = load_model(snakemake.input.model, snakemake.params.dtype)
    tables = {}
    for path in snakemake.input.tasks:
        table = sweep_subset(read_parquet(path), snakemake.params.max_items)
        tables[table["task"][0]] = table
    if snakemake.rule == "prune_gradual":
        result = gradual(model, tok, tables, batch_size=snakemake.params.batch_size)
    else:
        kept = json.loads(open(snakemake.input.minimal).read())["kept_layers"]
        result = individual(model, tok, tables, kept, batch_size=snakemake.params.batch_size)
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), snakemake.output[0])
    log.info("%s: %d rows", snakemake.rule, len(result))
