"""Rule prune_individual: remove each layer of the minimal model in turn and score every task."""

from gna.core.chance import ChancePolicy
from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.phases.pruning import run_prune_individual

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_prune_individual(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    snakemake.output[0],
    max_items=snakemake.params.max_items,
    evaluation=Evaluation(**snakemake.params.evaluation),
    chance=ChancePolicy(**snakemake.params.chance),
)
