"""Rule hybrid_swap: the pure-SSM student scored with its most critical layer run as attention."""

from gna.core.runtime import setup
from gna.core.settings import Files, StudentScoring
from gna.students.student_evaluation import run_hybrid_swap

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_hybrid_swap(
    snakemake.wildcards.model,
    snakemake.params.variant,
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    StudentScoring(**snakemake.params.scoring),
)
