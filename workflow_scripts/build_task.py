"""Build one evaluation set as Parquet (KV-retrieval, or MMLU in one format)."""
from gna.io import write_parquet
from gna.runtime import setup
from gna.tasks import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu

log = setup(snakemake.log[0])
if snakemake.rule == "kv_task":
    kv = snakemake.params.kv
    table = build_kv_retrieval(kv["sizes"], kv["n_per_size"], kv["seed"], kv["template"])
else:
    mmlu = snakemake.params.mmlu
    subset, pool = select_mmlu(load_mmlu_jsonl(snakemake.input[0]), mmlu["n"], mmlu["seed"], mmlu["topics"])
    table = build_mmlu(subset, pool, snakemake.wildcards.fmt, mmlu["num_fewshot"], mmlu["seed"])
write_parquet(table, snakemake.output[0])
log.info("wrote %d items to %s", len(table), snakemake.output[0])
