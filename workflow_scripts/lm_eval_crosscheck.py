"""Rule lm_eval_crosscheck: lm-eval on our own MMLU letter items, to check our scoring engine."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.phases.evaluation import run_crosscheck

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_crosscheck(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.task_dir,
    snakemake.output[0],
    evaluation=Evaluation(**snakemake.params.evaluation),
    memory_mb=snakemake.resources.mem_mb,
)
