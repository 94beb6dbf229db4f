"""Rule lmeval_crosscheck_task: our MMLU subset as an lm-eval YAML task folder."""

from gna.core.runtime import run_rule
from gna.tasks.lmeval_bridge import LmevalCrosscheckTask, run_lmeval_crosscheck_task

run_rule(snakemake, run_lmeval_crosscheck_task, LmevalCrosscheckTask)
