"""Rule heads_attribution: the attribution pre-ranking of every head, against the exact sweep."""

from gna.core.runtime import setup
from gna.phases.head_ablation import run_heads_attribution

setup(snakemake.log.log, snakemake.threads, outputs=snakemake.output)
run_heads_attribution(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.ranking,
    snakemake.output[0],
    snakemake.log.timings,
    sweep=snakemake.params.sweep,
    template=snakemake.params.template,
    top_n=snakemake.params.top_n,
    batch_size=snakemake.params.batch_size,
    dtype=snakemake.params.dtype,
    compute_dtype=snakemake.params.compute_dtype,
    order=snakemake.params.order,
)
