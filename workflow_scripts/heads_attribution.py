"""Rule heads_attribution: the attribution pre-ranking of every head, against the exact sweep."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.phases.head_ablation import run_heads_attribution

setup(snakemake.log.log, snakemake.threads, outputs=snakemake.output)
run_heads_attribution(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    snakemake.output[0],
    snakemake.log.timings,
    top_n=snakemake.params.top_n,
    evaluation=Evaluation(**snakemake.params.evaluation),
    order=snakemake.params.order,
)
