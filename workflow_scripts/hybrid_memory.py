"""Rule hybrid_memory: inference memory of the teacher and its students, with a measured check."""

from gna.core.runtime import run_rule
from gna.students.decoding import HybridMemory, run_hybrid_memory

run_rule(snakemake, run_hybrid_memory, HybridMemory)
