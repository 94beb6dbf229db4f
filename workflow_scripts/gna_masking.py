"""Rule gna_masking: per-sample G&A masking with the best-ranked Gather and Aggregate heads."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.phases.masking import run_gna_masking

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_gna_masking(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.roles,
    snakemake.input.knowledge,
    snakemake.input.choice,
    snakemake.input.prompts,
    snakemake.output[0],
    gna=snakemake.params.gna,
    evaluation=Evaluation(**snakemake.params.evaluation),
    scores_paths=snakemake.input.scores,
)
