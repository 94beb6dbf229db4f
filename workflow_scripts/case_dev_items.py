"""Rule case_dev_items: the case study's development MMLU letter questions (none evaluated) as Parquet."""

from gna.core.runtime import run_rule
from gna.tasks.tables import SweepPrompts, run_case_dev_items

run_rule(snakemake, run_case_dev_items, SweepPrompts)
