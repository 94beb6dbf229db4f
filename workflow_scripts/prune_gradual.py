"""Rule prune_gradual: accuracy of every prefix of the model's layers on each pruning task."""

from gna.core.chance import ChancePolicy
from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.phases.pruning import run_prune_gradual

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_prune_gradual(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    max_items=snakemake.params.max_items,
    evaluation=Evaluation(**snakemake.params.evaluation),
    chance=ChancePolicy(**snakemake.params.chance),
    retrieval_task=snakemake.params.retrieval_task,
)
