"""Rule hybrid_budget: one student scored after increasing amounts of distillation (its KD checkpoints)."""

from gna.core.runtime import setup
from gna.core.settings import Files, StudentScoring
from gna.students.student_evaluation import run_hybrid_budget

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_hybrid_budget(
    snakemake.wildcards.model,
    snakemake.wildcards.variant,
    Files.of(snakemake.input),
    snakemake.output[0],
    StudentScoring(**snakemake.params.scoring),
)
