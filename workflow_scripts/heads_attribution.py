"""Rule heads_attribution: the attribution pre-ranking of every head, against the exact sweep."""

from gna.core.runtime import run_rule
from gna.phases.head_ablation import HeadsAttribution, run_heads_attribution

run_rule(snakemake, run_heads_attribution, HeadsAttribution)
