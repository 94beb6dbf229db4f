"""Rule mmlu_task: the MMLU evaluation set in one format (letter or cloze) as Parquet."""

from gna.core.runtime import run_rule
from gna.tasks.tables import MmluTask, run_mmlu_task

run_rule(snakemake, run_mmlu_task, MmluTask)
