"""G&A role scores of every head on KV prompts, and the attention maps of the top-ranked heads."""
import polars as pl

from gna.gather_aggregate import head_roles, kv_row_segments, map_frame
from gna.io import read_parquet, write_parquet
from gna.models import load_model
from gna.runtime import setup
from gna.tasks import build_kv_retrieval

log = setup(snakemake.log[0], snakemake.threads)
cfg = snakemake.params.gna
model, tok = load_model(snakemake.input.model, snakemake.params.dtype)
ranking = read_parquet(snakemake.input.ranking)
table = build_kv_retrieval([cfg["dict_size"]], cfg["n"], cfg["seed"], snakemake.params.template)
roles = head_roles(model, tok, table, kv_row_segments, cfg["gather_min"], cfg["aggregate_min"])
roles = roles.join(ranking.select("layer", "head", "rank", "acc_drop"), on=["layer", "head"], how="left")
model_name = snakemake.wildcards.model
write_parquet(roles.with_columns(pl.lit(model_name).alias("model")), snakemake.output.roles)
sample = build_kv_retrieval([cfg["map_dict_size"]], 1, cfg["seed"], snakemake.params.template).row(0, named=True)
# the top-ranked heads, plus the best-ranked Gather and Aggregate heads if they are not among them
heads = list(zip(*ranking.sort("rank").head(cfg["map_heads"]).select("layer", "head").to_dict(as_series=False).values()))
for role in ("gather", "aggregate"):
    best = roles.filter(pl.col("role") == role).sort("rank").head(1)
    if not best.is_empty() and (best["layer"][0], best["head"][0]) not in heads:
        heads.append((best["layer"][0], best["head"][0]))
maps = map_frame(model, tok, sample, heads, kv_row_segments)
write_parquet(maps.with_columns(pl.lit(model_name).alias("model")), snakemake.output.maps)
for role in ("gather", "aggregate"):
    best = roles.filter(pl.col("role") == role).sort("rank").head(3)
    log.info("%s heads (best ranked): %s", role, ", ".join(f"L{r['layer']}H{r['head']} (rank {r['rank']})"
                                                           for r in best.iter_rows(named=True)))
