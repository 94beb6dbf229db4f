"""Rule hybrid_score: task scores, per-item answers and held-out perplexity of the teacher or one student."""

from gna.core.runtime import run_rule
from gna.students.student_evaluation import HybridScore, run_hybrid_score

run_rule(snakemake, run_hybrid_score, HybridScore)
