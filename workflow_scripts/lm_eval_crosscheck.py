"""Rule lm_eval_crosscheck: lm-eval on our own MMLU letter items, to check our scoring engine."""

from gna.core.runtime import run_rule
from gna.phases.evaluation import LmEvalCrosscheck, run_lm_eval_crosscheck

run_rule(snakemake, run_lm_eval_crosscheck, LmEvalCrosscheck)
