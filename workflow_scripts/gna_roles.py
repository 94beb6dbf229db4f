"""Rule gna_roles: G&A role scores of every head on KV prompts, and the maps of the chosen heads."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.phases.gather_aggregate import run_gna_roles

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_gna_roles(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    gna=snakemake.params.gna,
    evaluation=Evaluation(**snakemake.params.evaluation),
)
