"""Rule hybrid_budget: one student scored after increasing amounts of distillation (its KD checkpoints)."""

from gna.core.runtime import run_rule
from gna.students.student_evaluation import HybridBudget, run_hybrid_budget

run_rule(snakemake, run_hybrid_budget, HybridBudget)
