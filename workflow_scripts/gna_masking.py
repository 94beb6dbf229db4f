"""Rule gna_masking: per-sample G&A masking with the best-ranked Gather and Aggregate heads."""

from gna.core.runtime import run_rule
from gna.phases.masking import GnaMasking, run_gna_masking

run_rule(snakemake, run_gna_masking, GnaMasking)
