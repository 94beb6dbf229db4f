"""Rule sweep_prompts: a model's own head-sweep prompts (KV retrieval or MMLU development questions) as Parquet."""

from gna.core.runtime import run_rule
from gna.tasks.tables import SweepPrompts, run_sweep_prompts

run_rule(snakemake, run_sweep_prompts, SweepPrompts)
