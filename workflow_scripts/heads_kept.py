"""Rule heads_kept: the minimal model with only the top head kept in each of two critical layers."""

from gna.core.chance import ChancePolicy
from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.phases.head_tables import run_heads_kept

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_heads_kept(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    max_items=snakemake.params.max_items,
    evaluation=Evaluation(**snakemake.params.evaluation),
    chance=ChancePolicy(**snakemake.params.chance),
)
