"""Rule lmeval_crosscheck_task: our MMLU subset as an lm-eval YAML task folder."""

from gna.core.runtime import setup
from gna.tasks.lmeval_bridge import write_crosscheck_task

setup(snakemake.log[0], outputs=snakemake.output)
write_crosscheck_task(snakemake.input[0], snakemake.params.sha256, snakemake.params.mmlu, snakemake.output[0])
