"""Rule heads_sweep: ablate every head alone on KV-retrieval; the sweep and the head ranking."""

from gna.core.runtime import run_rule
from gna.phases.head_ablation import HeadsSweep, run_heads_sweep

run_rule(snakemake, run_heads_sweep, HeadsSweep)
