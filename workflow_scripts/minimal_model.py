"""Rule minimal_model: the smallest layer prefix that keeps the retrieval task's accuracy."""

from gna.core.runtime import setup
from gna.phases.pruning import run_minimal_model

setup(snakemake.log[0], outputs=snakemake.output)
run_minimal_model(
    snakemake.wildcards.model,
    snakemake.input[0],
    snakemake.output[0],
    task=snakemake.params.task,
    metric=snakemake.params.metric,
    fraction=snakemake.params.fraction,
)
