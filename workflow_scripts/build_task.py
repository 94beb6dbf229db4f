"""Build one evaluation set: KV-retrieval or MMLU in one format as Parquet, or the lm-eval
cross-check task (our MMLU subset as an lm-eval YAML task)."""
from gna.evaluation import CROSSCHECK_TASK
from gna.io import write_parquet
from gna.runtime import setup
from gna.sources import verify_sha256
from gna.tasks import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu

log = setup(snakemake.log[0])
if snakemake.rule == "kv_task":
    kv = snakemake.params.kv
    table = build_kv_retrieval(kv["sizes"], kv["n_per_size"], kv["seed"], kv["template"])
    write_parquet(table, snakemake.output[0])
    log.info("wrote %d items to %s", len(table), snakemake.output[0])
else:
    mmlu = snakemake.params.mmlu
    verify_sha256(snakemake.input[0], snakemake.params.sha256, snakemake.input[0])
    subset, pool = select_mmlu(load_mmlu_jsonl(snakemake.input[0]), mmlu["n"], mmlu["seed"], mmlu["topics"])
    if snakemake.rule == "lmeval_crosscheck_task":
        from gna.io import atomic_dir
        from gna.lmeval_bridge import write_local_mmlu_task

        with atomic_dir(snakemake.output[0]) as tmp:
            write_local_mmlu_task(subset, tmp, CROSSCHECK_TASK, final_dir=snakemake.output[0])
        log.info("wrote lm-eval task %s with %d items", CROSSCHECK_TASK, len(subset))
    else:
        table = build_mmlu(subset, pool, snakemake.wildcards.fmt, mmlu["num_fewshot"], mmlu["seed"])
        write_parquet(table, snakemake.output[0])
        log.info("wrote %d items to %s", len(table), snakemake.output[0])
