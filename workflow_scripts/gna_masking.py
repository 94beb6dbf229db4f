"""Per-sample G&A masking on KV-retrieval with the best-ranked Gather and Aggregate heads."""
import polars as pl

from gna.gather_aggregate import kv_row_segments
from gna.masking import masking_experiment
from gna.io import read_parquet, write_parquet
from gna.models import load_model
from gna.runtime import setup
from gna.tasks import build_kv_retrieval

log = setup(snakemake.log[0], snakemake.threads)


def mmlu_letter_masking(model, tok, heads):
    """The same experiment on MMLU letter (option lines as segments) for models above chance there."""
    from gna.gather_aggregate import mmlu_row_segments
    from gna.tasks import subset_evenly as sweep_subset
    from gna.scoring import score_table

    letter = sweep_subset(read_parquet(snakemake.input.mmlu_letter[0]), cfg["knowledge_items"])
    label = ", ".join(f"{role} L{l}H{h}" for role, (l, h) in heads.items())
    plain = score_table(model, tok, letter, batch_size=snakemake.params.batch_size, progress=False)
    acc = float(plain["correct"].mean())
    if acc < cfg["mmlu_min_acc"]:
        log.info("MMLU letter accuracy %.3f < gna.mmlu_min_acc %.2f: (b) and (c) not run on MMLU", acc, cfg["mmlu_min_acc"])
        return pl.DataFrame([{"condition": "(a) unmodified", "heads": label, "task": "mmlu_letter", "acc": acc,
                              "mean_logp": float(plain["logp_target"].mean()), "n": len(plain),
                              "note": f"at chance (< {cfg['mmlu_min_acc']:.0%}): (b), (c) not run"}])
    return masking_experiment(model, tok, letter, mmlu_row_segments, heads, batch_size=snakemake.params.batch_size)
cfg = snakemake.params.gna
roles = read_parquet(snakemake.input.roles)
heads = {}
for role in ("gather", "aggregate"):
    best = roles.filter(pl.col("role") == role).sort("rank").head(1)
    if not best.is_empty():
        heads[role] = (best["layer"][0], best["head"][0])
model_name = snakemake.wildcards.model
if len(heads) < 2:
    missing = ", ".join(sorted({"gather", "aggregate"} - set(heads)))
    log.warning("no %s head was classified, so the masking experiment (it needs both roles) is skipped", missing)
    result = pl.DataFrame(schema={"condition": pl.String, "heads": pl.String, "task": pl.String, "acc": pl.Float64,
                                  "mean_logp": pl.Float64, "n": pl.Int64})
else:
    model, tok = load_model(snakemake.input.model, snakemake.params.dtype)
    table = build_kv_retrieval([cfg["dict_size"]], cfg["masking_n"], cfg["seed"] + 1, snakemake.params.template)
    knowledge = None
    if snakemake.input.knowledge:
        from gna.tasks import subset_evenly as sweep_subset

        knowledge = sweep_subset(read_parquet(snakemake.input.knowledge[0]), cfg["knowledge_items"])
    result = masking_experiment(model, tok, table, kv_row_segments, heads, batch_size=snakemake.params.batch_size,
                                knowledge=knowledge)
    if snakemake.input.mmlu_letter:
        result = pl.concat([result, mmlu_letter_masking(model, tok, heads)], how="diagonal_relaxed")
    for row in result.iter_rows(named=True):
        log.info("%s %s: acc %.3f, mean logp %.3f", row["task"], row["condition"], row["acc"], row["mean_logp"])
from gna.hybrid import mixers

if len(heads) == 2 and mixers(model):  # a student: say which of the teacher's heads are SSM heads now
    ssm = {(m.layer_idx, h) for m in mixers(model) for h in m.ssm_heads}
    label = ", ".join(f"{role} L{l}H{h} ({'ssm' if (l, h) in ssm else 'attention'})" for role, (l, h) in heads.items())
    result = result.with_columns(pl.lit(label).alias("heads"))
write_parquet(result.with_columns(pl.lit(model_name).alias("model")), snakemake.output[0])
