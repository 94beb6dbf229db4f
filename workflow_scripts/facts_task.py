"""Rule facts_task: the facts task in one format (cloze or choice) as Parquet."""

from gna.core.runtime import run_rule
from gna.tasks.facts import FactsTask, run_facts_task

run_rule(snakemake, run_facts_task, FactsTask)
