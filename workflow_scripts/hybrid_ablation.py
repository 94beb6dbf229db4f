"""Rule hybrid_ablation: one student trained with one ingredient of the distillation recipe removed, scored."""

from gna.core.runtime import run_rule
from gna.students.recipe import HybridAblation, run_hybrid_ablation

run_rule(snakemake, run_hybrid_ablation, HybridAblation)
