"""Rule hybrid_ablation: one student trained with one ingredient of the distillation recipe removed, scored."""

from gna.core.runtime import setup
from gna.core.settings import Files, StudentScoring
from gna.students.recipe import run_hybrid_ablation

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_hybrid_ablation(
    snakemake.wildcards.model,
    snakemake.wildcards.ablation,
    snakemake.params.variant,
    Files.of(snakemake.input),
    snakemake.output[0],
    recipe=snakemake.params.recipe,
    scoring=StudentScoring(**snakemake.params.scoring),
)
