"""Rule gna_masking: per-sample G&A masking with the best-ranked Gather and Aggregate heads."""

from gna.core.chance import ChancePolicy
from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.phases.masking import run_gna_masking

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_gna_masking(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    gna=snakemake.params.gna,
    evaluation=Evaluation(**snakemake.params.evaluation),
    chance=ChancePolicy(**snakemake.params.chance),
)
