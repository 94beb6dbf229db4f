"""Rule prune_individual: remove each layer of the minimal model in turn and score every task."""

from gna.core.runtime import run_rule
from gna.phases.pruning import PruneIndividual, run_prune_individual

run_rule(snakemake, run_prune_individual, PruneIndividual)
