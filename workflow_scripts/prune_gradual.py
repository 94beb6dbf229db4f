"""Rule prune_gradual: accuracy of every prefix of the model's layers on each pruning task."""

from gna.core.runtime import run_rule
from gna.phases.pruning import PruneGradual, run_prune_gradual

run_rule(snakemake, run_prune_gradual, PruneGradual)
