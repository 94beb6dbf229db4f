"""Rule minimal_model: the smallest layer prefix that keeps the retrieval task's accuracy."""

from gna.core.runtime import run_rule
from gna.phases.pruning import MinimalModel, run_minimal_model

run_rule(snakemake, run_minimal_model, MinimalModel)
