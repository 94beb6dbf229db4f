"""Rule gna_masking: per-sample G&A masking with the best-ranked Gather and Aggregate heads."""

from gna.core.runtime import setup
from gna.phases.masking import run_gna_masking

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_gna_masking(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.roles,
    snakemake.input.knowledge,
    snakemake.input.choice,
    snakemake.output[0],
    gna=snakemake.params.gna,
    template=snakemake.params.template,
    batch_size=snakemake.params.batch_size,
    dtype=snakemake.params.dtype,
    compute_dtype=snakemake.params.compute_dtype,
    scores_paths=snakemake.input.scores,
)
