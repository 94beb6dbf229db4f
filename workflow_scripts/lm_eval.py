"""Rule lm_eval: run one lm-evaluation-harness task on a prepared model; tidy Parquet of its metrics."""

from gna.core.runtime import run_rule
from gna.phases.evaluation import LmEval, run_lm_eval

run_rule(snakemake, run_lm_eval, LmEval)
