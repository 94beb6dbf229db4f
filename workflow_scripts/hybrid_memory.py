"""Rule hybrid_memory: inference memory of the teacher and its students, with a measured check."""

from gna.core.runtime import setup
from gna.students.decoding import run_hybrid_memory

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_hybrid_memory(
    snakemake.wildcards.model,
    snakemake.input.model,
    list(snakemake.input.students),
    snakemake.output[0],
    memory=snakemake.params.memory,
)
