"""Rule hybrid_comparisons: the students compared item by item with their teacher and each other."""

from gna.core.runtime import setup
from gna.core.settings import Files
from gna.students.student_comparisons import run_hybrid_comparisons

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_hybrid_comparisons(
    snakemake.wildcards.model, snakemake.params.pure_ssm, Files.of(snakemake.input), Files.of(snakemake.output)
)
