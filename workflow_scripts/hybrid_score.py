"""Rule hybrid_score: task scores, per-item answers and held-out perplexity of the teacher or one student."""

from gna.core.runtime import setup
from gna.core.settings import Files, StudentScoring
from gna.students.student_evaluation import run_hybrid_score

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_hybrid_score(
    snakemake.wildcards.model,
    snakemake.wildcards.variant,
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    StudentScoring(**snakemake.params.scoring),
    kv_dict_size=snakemake.params.kv_dict_size,
)
