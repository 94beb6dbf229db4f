"""Rule distill_teacher: the distillation corpus and the teacher's activations on it."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.students.teacher_file import run_distill_teacher

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_distill_teacher(
    Files.of(snakemake.input),
    snakemake.output[0],
    corpus=p.corpus,
    top_k=p.top_k,
    seed=p.seed,
    mmlu=p.mmlu,
    template=p.template,
    evaluation=Evaluation(**p.evaluation),
)
