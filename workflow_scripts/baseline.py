"""Rule baseline: score one model on one task with our engine (per-item scores and a summary)."""

from gna.core.runtime import run_rule
from gna.phases.evaluation import Baseline, run_baseline

run_rule(snakemake, run_baseline, Baseline)
