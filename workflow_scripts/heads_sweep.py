"""Rule heads_sweep: ablate every head alone on KV-retrieval; the sweep and the head ranking."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.phases.head_ablation import run_heads_sweep

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_heads_sweep(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.prompts,
    snakemake.output.sweep,
    snakemake.output.ranking,
    sweep=snakemake.params.sweep,
    evaluation=Evaluation(**snakemake.params.evaluation),
)
