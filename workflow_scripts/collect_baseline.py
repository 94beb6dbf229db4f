"""Rule collect_baseline: every per-(model, task) baseline and lm-eval table as one tidy table."""

from gna.core.runtime import run_rule
from gna.phases.evaluation import CollectBaseline, run_collect_baseline

run_rule(snakemake, run_collect_baseline, CollectBaseline)
