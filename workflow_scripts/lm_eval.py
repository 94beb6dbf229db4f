"""Run one lm-evaluation-harness task on a prepared model; tidy Parquet of its metrics."""
from gna.evaluation import CROSSCHECK_TASK, run_lm_eval_task
from gna.runtime import setup

setup(snakemake.log[0], snakemake.threads)
if snakemake.rule == "lm_eval_crosscheck":
    task, options, include_path = CROSSCHECK_TASK, {"include_defaults": False}, snakemake.input.task_dir
else:
    task, options, include_path = snakemake.wildcards.lmtask, snakemake.params.options, snakemake.params.include_path
run_lm_eval_task(snakemake.wildcards.model, snakemake.input.model, task, snakemake.output[0],
                 options=options, include_path=include_path,
                 batch_size=snakemake.params.batch_size, dtype=snakemake.params.dtype)
