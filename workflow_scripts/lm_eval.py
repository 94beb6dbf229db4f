"""Rule lm_eval: run one lm-evaluation-harness task on a prepared model; tidy Parquet of its metrics."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.phases.evaluation import run_lm_eval_task

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_lm_eval_task(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.wildcards.lmtask,
    snakemake.output[0],
    options=snakemake.params.options,
    include_path=snakemake.params.include_path,
    evaluation=Evaluation(**snakemake.params.evaluation),
    memory_mb=snakemake.resources.mem_mb,
)
