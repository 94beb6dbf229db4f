"""Rule hybrid_answer_rows: a hybrid's attention heads with their answer rows masked."""

from gna.core.runtime import setup
from gna.core.settings import Files, StudentScoring
from gna.students.student_masking import run_hybrid_answer_rows

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_hybrid_answer_rows(
    snakemake.wildcards.model,
    snakemake.wildcards.variant,
    Files.of(snakemake.input),
    snakemake.output[0],
    StudentScoring(**snakemake.params.scoring),
)
