"""G&A role scores of every head on KV prompts, and the attention maps of the top-ranked heads."""
import polars as pl

from gna.gather_aggregate import head_roles, kv_row_segments, map_frame, mmlu_row_segments
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
# (a student uses its teacher's roles here, so teacher and students show the same heads)
heads = list(zip(*ranking.sort("rank").head(cfg["map_heads"]).select("layer", "head").to_dict(as_series=False).values()))
role_source = read_parquet(snakemake.input.teacher_roles[0]) if snakemake.input.teacher_roles else roles
for role in ("gather", "aggregate"):
    best = role_source.filter(pl.col("role") == role).sort("rank").head(1)
    if not best.is_empty() and (best["layer"][0], best["head"][0]) not in heads:
        heads.append((best["layer"][0], best["head"][0]))
maps = [map_frame(model, tok, sample, heads, kv_row_segments).with_columns(pl.lit("kv_retrieval").alias("task"))]
if snakemake.input.mmlu_letter:
    letter = read_parquet(snakemake.input.mmlu_letter[0])
    shortest = letter.with_columns(pl.col("context").str.len_chars().alias("chars")).sort("chars").row(0, named=True)
    maps.append(map_frame(model, tok, shortest, heads, mmlu_row_segments).with_columns(pl.lit("mmlu_letter").alias("task")))
write_parquet(pl.concat(maps).with_columns(pl.lit(model_name).alias("model")), snakemake.output.maps)
for role in ("gather", "aggregate"):
    best = roles.filter(pl.col("role") == role).sort("rank").head(3)
    log.info("%s heads (best ranked): %s", role, ", ".join(f"L{r['layer']}H{r['head']} (rank {r['rank']})"
                                                           for r in best.iter_rows(named=True)))
