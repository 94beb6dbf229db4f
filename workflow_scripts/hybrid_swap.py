"""Rule hybrid_swap: the pure-SSM student scored with its most critical layer run as attention."""

from gna.core.runtime import run_rule
from gna.students.student_evaluation import HybridSwap, run_hybrid_swap

run_rule(snakemake, run_hybrid_swap, HybridSwap)
