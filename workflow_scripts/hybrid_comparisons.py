"""Rule hybrid_comparisons: the students compared item by item with their teacher and each other."""

from gna.core.runtime import run_rule
from gna.students.student_comparisons import HybridComparisons, run_hybrid_comparisons

run_rule(snakemake, run_hybrid_comparisons, HybridComparisons)
