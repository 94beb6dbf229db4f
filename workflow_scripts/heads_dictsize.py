"""Rule heads_dictsize: KV accuracy per dictionary size with the #1 or #2 ranked head removed."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.phases.head_tables import run_heads_dictsize

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_heads_dictsize(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.prompts,
    snakemake.input.ranking,
    snakemake.output[0],
    evaluation=Evaluation(**p.evaluation),
)
